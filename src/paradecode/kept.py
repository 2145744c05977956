"""What a method learned of a model on this machine, kept in the cache folder for later processes.

``auto`` measures each drafter's speed as it decodes; those numbers hold for one model on one machine, and a
fresh process that starts from them skips its warm-up. A ``KeptFile`` is one JSON file in the model cache
(``<cache>/kept/<method>-<hash of the identity>.json``) with the identity its numbers depend on: the model
folder, the backend, the dtype, the method's options and the machine (CPU model, threads, torch), checked again
when it is read. A file made for another identity, one that is truncated or not JSON, is ignored with a warning
that says why, and replaced when the method next writes; a cache folder that cannot be written only costs the
next process its warm start.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 2  # 2: auto's estimates lost the fastest step (version-1 files hold estimates skewed by it)


@dataclass
class KeptFile:
    path: Path
    identity: dict[str, str]  # what the kept numbers depend on; a file with another identity is not used
    _warned: bool = field(default=False, repr=False)

    @classmethod
    def in_cache(cls, cache: Path, method: str, identity: dict[str, str]) -> "KeptFile":
        """The file for ``method`` under this ``identity``: one per model, backend, dtype, options and machine (a
        home folder shared by two machines, or runs with another thread count, keep a file each)."""
        digest = hashlib.sha256(json.dumps(sorted(identity.items())).encode()).hexdigest()[:16]
        return cls(Path(cache) / "kept" / f"{method}-{digest}.json", dict(identity))

    def read(self) -> dict[str, Any] | None:
        """The kept payload, or None (no file yet, or one that cannot be used: warned once, with the reason)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):  # none yet (a file in the folder's place: write() warns)
            return None
        except OSError as error:
            return self.ignore(f"it cannot be read ({error.strerror or error})")
        try:
            kept = json.loads(text)
        except ValueError:
            return self.ignore("it is not valid JSON (truncated, or written by something else)")
        if not isinstance(kept, dict) or kept.get("version") != VERSION or not isinstance(kept.get("payload"), dict):
            return self.ignore(f"it is not a version-{VERSION} kept file")
        identity = kept.get("identity")
        if not isinstance(identity, dict):
            return self.ignore("it names no model or machine")
        for key, value in self.identity.items():
            if identity.get(key) != value:
                return self.ignore(f"it was measured with {key} {identity.get(key)!r}, and this is {value!r}")
        return kept["payload"]

    def write(self, payload: dict[str, Any]) -> None:
        """Replace the file with ``payload`` (written whole to a temporary file of this thread's, then renamed over
        it: concurrent requests of one process, batched, each end by writing it)."""
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(dict(version=VERSION, identity=self.identity, payload=payload),
                                            indent=1), encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError as error:
            if not self._warned:
                warnings.warn(f"paradecode: could not keep measurements in {self.path} ({error.strerror or error}); "
                              "the next process starts without them.", stacklevel=3)
                self._warned = True

    def ignore(self, reason: str) -> None:
        """Warn (once) that the file is not used, and why."""
        if not self._warned:
            warnings.warn(f"paradecode: ignoring {self.path}: {reason}; starting without it (it is replaced when "
                          "this run keeps its own measurements).", stacklevel=4)
            self._warned = True
        return None
