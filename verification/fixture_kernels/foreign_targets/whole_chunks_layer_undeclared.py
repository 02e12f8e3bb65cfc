"""verification.fixture_kernels.foreign_targets.whole_chunks_layer's kernel declared without
its limits: the contract's shapes are drawn, and those it refuses raise."""

from verification import KernelDeclaration, Supports

from .whole_chunks_layer import gdn_decoupled_conv1d

GDN_KERNEL = KernelDeclaration(gdn_decoupled_conv1d=gdn_decoupled_conv1d,
                               supports=Supports(carried_state=False))
