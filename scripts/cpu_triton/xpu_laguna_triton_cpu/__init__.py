"""Triton backend ``cpu`` of a stand-in CPU runtime (see scripts/cpu_triton/__init__.py in the repository)."""


def install() -> None:
    """What the runtime's ``.pth`` runs at start-up: the interpreter's fixes (:mod:`.masks`), its
    fast path (:mod:`.fast_launch`, unless VXL_TRITON_STOCK_INTERPRETER=1) and, with
    VXL_TRITON_RECORD=DIR, the launch recorder (:mod:`.record`); each applied when Triton imports
    its interpreter, nothing imported now."""
    from . import fast_launch, masks, record

    masks.install()
    fast_launch.install()
    record.install()
