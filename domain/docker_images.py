"""Which Docker images a session may name: Docker's reference grammar, a pinned tag, and the operator's allowlist.

Pure: no I/O. An image reference is checked with ``docker-image-py``, a port of Docker's own parser
(``github.com/distribution/reference``, ``ParseNormalizedNamed``): lowercase path components separated by ``/``,
an optional registry host (with a ``.`` or a ``:port``, or ``localhost``), a tag and/or a digest. On top of the
grammar:

- the whole reference is at most :data:`MAX_REFERENCE_LENGTH` characters;
- it carries an explicit tag other than ``latest``: Nomad's docker driver pulls an image tagged ``latest``
  (which a reference without a tag means) at every start, whatever is on the node;
- it matches one of the operator's glob patterns (``Settings.docker_images``, ``CARAVAN_DOCKER_IMAGES``; by default
  the namespace ``ops/build-images`` builds locally, ``caravan/*``), matched against the reference as written.

A refusal is ``INVALID_INPUT`` on the field that named the image (``image``, ``kernelRoles.<role>.image``).
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from docker_image.reference import InvalidReference, Reference

from core.errors import InvalidInput

MAX_REFERENCE_LENGTH = 255
UNPINNED_TAG = "latest"


def check_docker_image(reference: str, allowed: Sequence[str], *, field: str = "image") -> None:
    """Refuse (``INVALID_INPUT`` on ``field``) a reference that is not Docker's grammar, is longer than 255
    characters, has no tag or the tag ``latest``, or matches none of the ``allowed`` glob patterns."""
    shown = reference if len(reference) <= 80 else reference[:77] + "..."
    if len(reference) > MAX_REFERENCE_LENGTH:
        raise InvalidInput(f"image reference is longer than {MAX_REFERENCE_LENGTH} characters", field=field)
    try:
        if not reference.isprintable():  # the port's regexps end in '$', which also matches before a final newline
            raise InvalidReference("invalid reference format: unprintable characters")
        parsed = Reference.parse_normalized_named(reference)
    except InvalidReference as exc:
        raise InvalidInput(
            f"{shown!r} is not a Docker image reference ([host[:port]/]path:tag, lowercase path): {exc}", field=field
        ) from exc
    if not parsed["tag"]:
        raise InvalidInput(f"{shown!r} names no tag: add a fixed one (name:tag, not {UNPINNED_TAG!r})", field=field)
    if parsed["tag"] == UNPINNED_TAG:
        raise InvalidInput(
            f"{shown!r} uses the tag {UNPINNED_TAG!r}, which Nomad pulls again at every start: name a fixed tag",
            field=field,
        )
    if not any(fnmatchcase(reference, pattern) for pattern in allowed):
        raise InvalidInput(f"{shown!r} is not an allowed image (allowed: {', '.join(allowed) or 'none'})", field=field)
