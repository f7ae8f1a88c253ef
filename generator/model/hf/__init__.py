"""Hugging Face model directories: the import (load.py) of config.json (config.py, families.py)
and the safetensors shards (safetensors_io.py) under canonical tensor names (names.py) as views
read when asked (views.py, mxfp4.py)."""
