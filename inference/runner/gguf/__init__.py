"""GGUF checkpoints: ``weights`` reads a file's tensors by a cached index with Hugging
Face names, ``blocks`` parses the quantized block layouts the CPU kernels take.

(``import gguf`` inside this package still means gguf-py: imports are absolute.)"""
