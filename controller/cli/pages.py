"""Every page of a paged list call (``ListNodes``, ``ListAllocations``).

The controller answers a list a page at a time (``page_size``, at most 5000)
and hands back a ``next_page_token`` until the last page. These helpers send
the same request, filters and all, with each token in turn and return every
item: what ``kiln nodes list`` and ``kiln alloc list`` print as one table,
and what ``kiln demo`` counts. They import only the API's messages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from controller.cli.client import CliError

PAGE_SIZE = 1000
"""Items the CLI asks for per page."""

MAX_PAGES = 100_000
"""A controller that never ends a list is refused rather than followed forever."""


def _next(request: Any, response: Any, seen: set[str], pages: int) -> bool:
    """Point ``request`` at the page after ``response``; False after the last."""
    token: str = response.next_page_token
    if not token:
        return False
    if token in seen or pages >= MAX_PAGES:
        raise CliError("the controller's list never ends (a page token came back twice)")
    seen.add(token)
    request.page_token = token
    return True


def every_page(
    call: Callable[..., Any], request: Any, field: str, *, page_size: int = PAGE_SIZE, **kwargs: Any
) -> list[Any]:
    """The ``field`` items of every page ``call`` returns for ``request``
    (left unchanged; ``kwargs`` such as ``timeout`` go with each call)."""
    paged = type(request)()
    paged.CopyFrom(request)
    paged.page_size = paged.page_size or page_size
    items: list[Any] = []
    seen: set[str] = set()
    pages = 0
    while True:
        response = call(paged, **kwargs)
        pages += 1
        items.extend(getattr(response, field))
        if not _next(paged, response, seen, pages):
            return items


async def every_page_async(
    call: Callable[..., Awaitable[Any]],
    request: Any,
    field: str,
    *,
    page_size: int = PAGE_SIZE,
    **kwargs: Any,
) -> list[Any]:
    """``every_page`` for an asyncio stub."""
    paged = type(request)()
    paged.CopyFrom(request)
    paged.page_size = paged.page_size or page_size
    items: list[Any] = []
    seen: set[str] = set()
    pages = 0
    while True:
        response = await call(paged, **kwargs)
        pages += 1
        items.extend(getattr(response, field))
        if not _next(paged, response, seen, pages):
            return items
