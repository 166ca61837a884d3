"""Neural-network layers (API.md §7.1); optim, state and datasets are submodules."""
