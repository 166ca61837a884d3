"""Model definitions built on the public API only (Tensor, nn, nn.state): bert, gpt2, llama."""
