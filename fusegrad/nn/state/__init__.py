"""State I/O (docs/api.md, State files): state dicts, safetensors, PyTorch checkpoints, tar/zip archives and GGUF files,
one format a module.

Files are read through a memory map (device "DISK:<path>"), so loading reads headers only: a tensor's bytes are read
when it is first used. Every malformed file raises ValueError naming the file, the key and the values involved.
"""

from fusegrad.nn.quantized import GGMLQuantized
from fusegrad.nn.state.archives import tar_extract, zip_extract
from fusegrad.nn.state.blob import TensorIO
from fusegrad.nn.state.dicts import get_parameters, get_state_dict, load_state_dict
from fusegrad.nn.state.gguf import ggml_data_to_tensor, gguf_load
from fusegrad.nn.state.safetensors import safe_load, safe_load_metadata, safe_save
from fusegrad.nn.state.torch_formats import torch_load


__all__ = [
    "GGMLQuantized",
    "TensorIO",
    "get_parameters",
    "get_state_dict",
    "ggml_data_to_tensor",
    "gguf_load",
    "load_state_dict",
    "safe_load",
    "safe_load_metadata",
    "safe_save",
    "tar_extract",
    "torch_load",
    "zip_extract",
]
