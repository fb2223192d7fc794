"""Every read, write, move and removal under a folder that others can write to: descriptors all the
way down.

A root daemon on a shared inbox must never be turned into one user's tool against another. Checking
a path and then using it are two steps a user can race, by swapping a folder on the way for a
symlink between them. So a folder here is reached from a configured root one component at a time
with ``O_NOFOLLOW | O_DIRECTORY``, and everything done inside it goes through that folder's
descriptor (``dir_fd=``): no path is resolved again after it was checked, and no link is followed,
to a file or a folder. Files written get no more readers than the source they were made from
(``Access``), set on the descriptor before the rename makes them visible. Everything here is
blocking.
"""

from ocrwatch.safefs.base import (
    ASIDE_MARKER,
    CHUNK,
    FILE_FLAGS,
    FOLDER_FLAGS,
    GONE,
    LEASE_SIGNAL,
    NEW_FLAGS,
    NO_LEASE,
    NO_LINK,
    PUBLIC,
    TMP_MARKER,
    UMASK,
    Access,
    FolderGone,
    Occupant,
    Replaced,
    Signature,
    Stopped,
    TooLarge,
    aside_name,
    copy_fd,
    describe,
    hash_fd,
    parts_below,
    read_head,
    read_lease,
    sha256_file,
    temporary_name,
    write_all,
)
from ocrwatch.safefs.folders import Folder, Staged, folder, walk

__all__ = [
    "FOLDER_FLAGS",
    "FILE_FLAGS",
    "NEW_FLAGS",
    "CHUNK",
    "GONE",
    "TMP_MARKER",
    "ASIDE_MARKER",
    "NO_LINK",
    "NO_LEASE",
    "LEASE_SIGNAL",
    "UMASK",
    "Signature",
    "Replaced",
    "FolderGone",
    "Access",
    "PUBLIC",
    "Occupant",
    "describe",
    "parts_below",
    "temporary_name",
    "read_head",
    "copy_fd",
    "hash_fd",
    "sha256_file",
    "TooLarge",
    "Stopped",
    "write_all",
    "read_lease",
    "aside_name",
    "Staged",
    "Folder",
    "folder",
    "walk",
]
