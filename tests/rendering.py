"""Rendering a bare list of linear UOps in tests: with its lanes packed for the renderer's target first, as
codegen's pack_vectors stage packs them before a device renders a kernel."""

from fusegrad.codegen import pack_vectors


def rendered(renderer, name: str, lin) -> str:
    """The renderer's source of lin with the lanes packed for its target."""
    return renderer.render(name, lin, pack_vectors(tuple(lin), renderer.capabilities))
