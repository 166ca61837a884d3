"""CONTIGUOUS args that promise no buffer of their own (the planner may leave them unstored)."""

# a layout store the planner may fuse into its reader's kernel (a conv's flat output under its ReLU or residual add);
# it is stored when its reader would read it per window tap or inside another sum (schedule/planner.py)
EPILOGUE_STORE = "epilogue"
# an identity forward ("backward": the gradient flowing back is stored), or a fusable layout store
FUSABLE_STORES = frozenset({"backward", EPILOGUE_STORE})
