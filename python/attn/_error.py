"""attn.Error and attn.Status: the library's status table in Python."""

import enum

from . import _attn

# The library's one table (attn.h's ATTN_STATUS_MAP): OK, ENULL, ... with
# their values; attn_strerror's messages are STATUS_MESSAGES.
Status = enum.IntEnum("Status", [(name, value) for value, name, _ in _attn.statuses()])
Status.__doc__ = "attn's status codes (attn.h's ATTN_STATUS_MAP), without the ATTN_ prefix."
Status.__module__ = "attn"
STATUS_MESSAGES = {Status(value): message for value, _, message in _attn.statuses()}


class Error(RuntimeError):
    """A call that attn refused or that failed.

    status: the attn.Status (an int; .name gives "EALIAS" for ATTN_EALIAS).
    message: the library's sentence saying what was wrong, naming the argument
    (attn_errmsg), e.g. "k: head_dim 96 differs from q's 64".
    """

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        name = status.name if isinstance(status, Status) else str(status)
        super().__init__("ATTN_%s: %s" % (name, message))

    def __reduce__(self):
        return (type(self), (int(self.status), self.message))


Error.__module__ = "attn"
