"""Hugging Face model directories: config.json (+ generation_config.json) and safetensors shards
(load.py), the safetensors reader (safetensors_io.py)."""
