"""gdn-verify: the property-based suite for Gated DeltaNet kernels.

A kernel module declares itself with `KernelDeclaration` (what it
implements), `Supports` (what it accepts) and `Limits` (the shapes it
takes); a kernel in other
conventions is wrapped by `adapt` (and `mixer_from_core`), a whole layer
in its own conventions by `adapt_mixer`, a PyTorch kernel made a JAX
function by `from_torch` (an MLX one by `from_mlx`), then adapted like any
other; see
docs/verify-your-kernel.md.
"""

from .targets.declaration import KernelDeclaration, Limits, Supports

__all__ = ["KernelDeclaration", "Limits", "Supports", "adapt", "adapt_mixer", "from_mlx",
           "from_torch", "mixer_from_core"]


def __getattr__(name):
    # the adapters import jax: only when asked for (the pytest plugin
    # imports this package in every pytest run, target or not)
    if name in ("adapt", "mixer_from_core"):
        from .targets import adapters
        return getattr(adapters, name)
    if name == "adapt_mixer":
        from .targets import layer_adapter
        return layer_adapter.adapt_mixer
    if name == "from_torch":
        from .targets import torch_bridge
        return torch_bridge.from_torch
    if name == "from_mlx":
        from .targets import mlx_bridge
        return mlx_bridge.from_mlx
    raise AttributeError(f"module 'verification' has no attribute {name!r}")
