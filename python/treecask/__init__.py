"""treecask: single-file checkpoint archives for NumPy / JAX pytrees.

One archive is one file (an LMDB environment with a FlatBuffers manifest):
atomic to write, checksummed per chunk, memory-mapped and zero-copy to read,
with the tree's structure, node types and box metadata (Flax partition names,
NNX sharding, Penzai axis names) kept next to the tensors.

    import treecask
    treecask.save("ckpt.cask", {"params": params, "opt_state": opt_state, "step": 10})
    state = treecask.load("ckpt.cask", like=abstract_state)        # exact types back
    enc = treecask.load("ckpt.cask", subtree="params/encoder")      # reads only that part
    with treecask.open("ckpt.cask") as a:
        w = a["params/encoder/w"]                                   # zero-copy view
    treecask.sign("ckpt.cask", private_key="key.pem")               # an OpenSSF model-signing bundle
    w = treecask.load("ckpt.cask", signature="ckpt.cask.sig", public_key="key.pub.pem")  # verified
    with treecask.CheckpointManager("ckpts", max_to_keep=3) as mngr:  # a training loop
        mngr.save(step, state, metrics={"loss": loss})              # async, snapshot first
        state = mngr.restore(like=abstract_state)                   # the latest step

See docs/python.md.
"""

from . import _core, stores
from ._archive import Archive
from ._reader import Reader
from ._open import load, open, verify
from ._save import save
from ._signing import sign
from ._types import LeafInfo, SaveStats, ShardBox, ShardingInfo, TreeNode
# CheckpointManager (python/treecask/_manager.py; its parts _run.py, _retention.py, _async.py)
from ._manager import CheckpointManager, StepInfo
from . import errors, interop
from .errors import *  # noqa: F401,F403 -- every error class, errors.__all__

# ---- interop: Orbax and legacy Flax checkpoints in, Hugging Face safetensors layouts in and out ----
from .interop import *  # noqa: F401,F403 -- interop.__all__

# ---- multi-process (jax.distributed) sharded checkpoints: docs/python.md ----
from ._sharded import ShardedArchive  # noqa: E402

__version__ = "0.2.0"
#: Highest archive format version this build writes and reads. It writes the
#: lowest that holds an archive: 1.0, 2.0 when ``save(shuffle=True)`` shuffled
#: a leaf, 4.0 with a dtype of format 4.0, and 3.1 (4.1) only for the index of
#: a multi-process checkpoint (format/SPEC.md "Versioning").
FORMAT_VERSION = (_core.FORMAT_MAJOR, _core.FORMAT_MINOR)


def __getattr__(name: str):
    """``treecask.ShardedCheckpoint``: the name of :class:`ShardedArchive` before
    0.3 (one name in both languages now, as the C++ ``treecask::ShardedArchive``);
    it still works and warns (DeprecationWarning)."""
    if name == "ShardedCheckpoint":
        import warnings

        warnings.warn("treecask.ShardedCheckpoint is now treecask.ShardedArchive (the C++ name)",
                      DeprecationWarning, stacklevel=2)
        return ShardedArchive
    raise AttributeError(f"module 'treecask' has no attribute {name!r}")


def library_version() -> str:
    """Version of the C++ library compiled into the extension."""
    return _core.library_version()


__all__ = [
    "Reader", "Archive", "ShardedArchive", "stores", "LeafInfo", "SaveStats", "ShardingInfo", "ShardBox", "TreeNode",
    "save", "load", "open", "sign", "verify", "library_version", "CheckpointManager", "StepInfo", "FORMAT_VERSION",
    *errors.__all__, *interop.__all__,
]
