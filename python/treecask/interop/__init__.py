"""Other checkpoint formats in and out of treecask archives: Orbax
checkpoints (:func:`import_orbax`, ``orbax.py``), legacy Flax checkpoints
(:func:`import_flax`, ``flax.py``) and Hugging Face safetensors layouts
(:func:`import_safetensors` / :func:`export_safetensors`, ``hf.py``, over the
C++ ``treecask_interop`` library). Every name is re-exported by ``treecask``."""

from .flax import FlaxImport, import_flax
from .hf import SafetensorsExport, SafetensorsImport, export_safetensors, import_safetensors
from .orbax import OrbaxImport, import_orbax

__all__ = ["OrbaxImport", "import_orbax", "FlaxImport", "import_flax", "SafetensorsImport", "SafetensorsExport",
           "import_safetensors", "export_safetensors"]
