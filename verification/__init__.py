"""gdn-verify: the property-based suite for Gated DeltaNet kernels.

A kernel module declares itself with `KernelDeclaration` (what it
implements) and `Supports` (what it accepts); see docs/kernel-authors.md.
"""

from .declaration import KernelDeclaration, Supports

__all__ = ["KernelDeclaration", "Supports"]
