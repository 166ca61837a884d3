"""The main demo: a fused computation, how many kernels it took, and the C it became.

Run: python examples/hello.py"""

import numpy as np
from fusegrad import Context, GlobalCounters, Tensor


def main() -> None:
    rng = np.random.default_rng(0)
    a, b = Tensor(rng.standard_normal((4, 8), dtype=np.float32)), Tensor(rng.standard_normal((4, 8), dtype=np.float32))
    bias = Tensor(rng.standard_normal(8, dtype=np.float32))
    print("computing ((a*b + bias).relu()).sum(axis=1) and (a @ b.T).relu() with DEBUG=4 (generated C below):\n")
    GlobalCounters.reset()
    with Context(DEBUG=4):
        fused = ((a * b + bias).relu()).sum(axis=1).numpy()
        mm = (a @ b.T).relu().numpy()
    ref_fused = np.maximum(a.numpy() * b.numpy() + bias.numpy(), 0).sum(axis=1)
    ref_mm = np.maximum(a.numpy() @ b.numpy().T, 0)
    print(f"fused result  {np.round(fused, 4)}")
    print(f"kernels run: {GlobalCounters.kernel_count} for two expressions of 4 and 3 ops")
    print(f"matches numpy: {np.allclose(fused, ref_fused, atol=1e-5) and np.allclose(mm, ref_mm, atol=1e-5)}")


if __name__ == "__main__":
    main()
