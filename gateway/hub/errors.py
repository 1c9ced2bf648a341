"""What a pull that cannot go on raises: ``PullError``s, which are ``ApiError``s, each kind its
status and code. A message is bounded (``MAX_MESSAGE``), whatever a hub wrote into it: a pull's
error is kept, listed in ``/models`` and the page, and logged. ``some`` names a few of a
listing's choices and counts the rest."""

from __future__ import annotations

from ..base.errors import ApiError

MAX_MESSAGE = 1000  # characters of a pull's error: it is kept, listed in /models and logged
SHOWN_CHOICES = 8  # choices a message names before it counts the rest
SHOWN_CHOICE = 64  # characters of each
SHOWN_WIDTH = 300  # characters of them all
class PullError(ApiError):
    """A pull that cannot go on, as an HTTP caller is told it (each kind its status and code;
    ``param`` is the model's name, which is what the caller got wrong where it is a 4xx)."""

    STATUS, CODE = 502, "pull_failed"

    def __init__(self, message: str):
        if len(message) > MAX_MESSAGE:  # what a hub wrote can reach a message: bounded whatever it wrote
            message = message[: MAX_MESSAGE - 1] + "\u2026"
        super().__init__(message, status=self.STATUS, code=self.CODE, param="model" if self.STATUS < 500 else None)


def some(choices: list[str] | tuple[str, ...], limit: int = SHOWN_CHOICES) -> str:
    """The first few of ``choices`` (at most ``limit``, each cut to ``SHOWN_CHOICE`` characters, all
    within ``SHOWN_WIDTH``) and how many there are, for a message: a listing is the hub's to write,
    and may hold thousands of long names."""
    shown: list[str] = []
    for choice in choices[:limit]:
        cut = choice if len(choice) <= SHOWN_CHOICE else choice[: SHOWN_CHOICE - 1] + "\u2026"
        if shown and sum(len(c) + 2 for c in shown) + len(cut) > SHOWN_WIDTH:
            break
        shown.append(cut)
    text = ", ".join(shown)
    return text if len(shown) == len(choices) else f"{text}, ... ({len(choices)} in all)"


class NotFound(PullError):
    STATUS, CODE = 404, "model_not_found"


class NoStore(PullError):
    STATUS, CODE = 501, "no_store_to_pull_into"


class BadPullName(PullError):
    STATUS, CODE = 400, "invalid_model_name"


class Ambiguous(PullError):
    STATUS, CODE = 400, "ambiguous_model_name"


class Gated(PullError):
    STATUS, CODE = 403, "model_gated"


class Unreachable(PullError):
    STATUS, CODE = 502, "hub_unreachable"


class TimedOut(PullError):
    STATUS, CODE = 504, "hub_timeout"


class Unverifiable(PullError):
    """A file the hub gives no size or no digest for: it would be written unbounded or unchecked."""

    STATUS, CODE = 502, "download_unverifiable"


class Offline(PullError):
    STATUS, CODE = 503, "hub_offline"


class Corrupt(PullError):
    STATUS, CODE = 502, "download_corrupt"


class NoSpace(PullError):
    STATUS, CODE = 507, "insufficient_storage"


class Refused(PullError):
    STATUS, CODE = 502, "redirect_refused"


class Cancelled(PullError):
    STATUS, CODE = 409, "pull_cancelled"
