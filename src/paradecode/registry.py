"""Registries (one name -> one class) and the method resolver every entry point asks.

``Registry`` is the one registry type: decoding methods (``METHODS``, filled by ``@register("pld")``),
benchmark peers (``benchmark.peers.PEERS``) and masked-diffusion samplers (``dllm.samplers.base.SAMPLERS``).
Each registered class carries an ``Options`` frozen dataclass; ``build_options`` turns user-given values into
it with one clear message per mistake.

``resolve_method`` is the only place that decides, for a method name and options (and a draft model), whether
the method is known, whether it takes those options, whether it needs a draft model and whether it samples
exactly: the CLI, the Python API, the server, the benchmark and ``auto`` all call it, before any model loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from paradecode.errors import ParadecodeError

# The method a request gets when it names none (CLI, Python API, server): ``auto`` picks the fastest lossless
# drafter as it decodes; ``ar`` is plain decoding.
DEFAULT_METHOD = "auto"

if TYPE_CHECKING:
    from paradecode.drafters.base import Drafter, DrafterContext


class Registry(MutableMapping):
    """Names -> classes, filled by the ``register(name)`` decorator. ``kind`` names an entry in messages
    ("unknown sampler ..."); ``builtins`` is the module whose import registers the built-in entries, imported
    on first lookup; ``name_attribute`` is the class attribute that receives the registered name."""

    def __init__(self, kind: str, builtins: str | None = None, name_attribute: str = "method_name") -> None:
        self.kind, self.builtins, self.name_attribute = kind, builtins, name_attribute
        self._entries: dict[str, type] = {}

    def register(self, name: str) -> Callable[[type], type]:
        def wrap(cls: type) -> type:
            if name in self._entries and self._entries[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = cls
            setattr(cls, self.name_attribute, name)
            return cls

        return wrap

    def names(self) -> list[str]:
        return sorted(self)

    def lookup(self, name: str) -> type:
        """The class registered as ``name``, or a ParadecodeError listing the names there are."""
        if name not in self:
            raise ParadecodeError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}.")
        return self._entries[name]

    def _loaded(self) -> dict[str, type]:
        if self.builtins is not None:
            importlib.import_module(self.builtins)
        return self._entries

    def __getitem__(self, name: str) -> type:
        return self._loaded()[name]

    def __setitem__(self, name: str, cls: type) -> None:
        self._entries[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()


METHODS = Registry("method", builtins="paradecode.drafters")
register = METHODS.register
method_names = METHODS.names
get_method = METHODS.lookup


def build_options(cls: type, raw: Mapping[str, Any], label: str | None = None) -> Any:
    """``cls.Options`` (a frozen dataclass; anything else means "no options") from user-given values, each
    checked against its field's default type. ``label`` names the owner in messages (default: the method)."""
    label = label or f"method {getattr(cls, 'method_name', cls.__name__)!r}"
    options_type = cls.Options
    if not dataclasses.is_dataclass(options_type):
        if raw:
            raise ParadecodeError(f"{label} takes no options, got {sorted(raw)}.")
        return None
    fields = {f.name: f for f in dataclasses.fields(options_type)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParadecodeError(f"{label} has no option {', '.join(unknown)}; its options are: "
                              f"{', '.join(fields) or 'none'}.")
    values = {}
    for name, value in raw.items():
        default = fields[name].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ParadecodeError(f"option {name} of {label} must be true or false, got {value!r}.")
        if isinstance(default, int) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, int)
        ):
            raise ParadecodeError(f"option {name} of {label} must be an integer, got {value!r}.")
        if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ParadecodeError(f"option {name} of {label} must be a number, got {value!r}.")
        values[name] = float(value) if isinstance(default, float) else value
    try:
        return options_type(**values)
    except ParadecodeError:
        raise
    except (TypeError, ValueError) as error:
        raise ParadecodeError(f"bad options for {label}: {error}.") from None


def option_names(cls: type) -> list[str]:
    """The names of the options ``cls`` takes."""
    return [f.name for f in dataclasses.fields(cls.Options)] if dataclasses.is_dataclass(cls.Options) else []


@dataclass(frozen=True)
class MethodChoice:
    """A known method with options it takes: what ``resolve_method`` returns."""

    name: str
    drafter: type["Drafter"]
    options: dict[str, Any]  # the raw values, checked (``settings`` holds them as the method's Options)
    settings: Any  # the drafter's Options instance (None for a method without options)

    @property
    def takes_draft_model(self) -> bool:
        return takes_draft_model(self.drafter)

    @property
    def samples_exactly(self) -> bool:
        """Whether sampling (temperature > 0) with this method draws exactly from the model's distribution."""
        return self.drafter.lossless_sampling

    def check_sampling(self, greedy: bool) -> None:
        """Refuse sampling with a method that cannot sample exactly."""
        if not greedy and not self.samples_exactly:
            raise ParadecodeError(f"method {self.name!r} cannot sample exactly from the model's distribution; "
                                  "use temperature 0 (greedy) with it, or another method for sampling.")

    def create(self, context: "DrafterContext | None" = None) -> "Drafter":
        return self.drafter(self.settings, context)


def takes_draft_model(cls: type) -> bool:
    """Whether a method drafts with a separate draft model (it has a ``draft_model`` option)."""
    return "draft_model" in option_names(cls)


def resolve_method(name: str, options: Mapping[str, Any] | None = None,
                   draft_model: str | None = None) -> MethodChoice:
    """Check ``name`` and ``options`` (raw values, e.g. from ``parse_options``): a ParadecodeError names the
    first mistake. ``draft_model`` goes to the method's ``draft_model`` option when it has one and the options
    do not set it; a method without that option ignores it."""
    return resolve_drafter(get_method(name), options, draft_model)


def resolve_drafter(cls: type["Drafter"], options: Mapping[str, Any] | None = None,
                    draft_model: str | None = None) -> MethodChoice:
    """``resolve_method`` for a drafter class already looked up. An option under its old name
    (``cls.renamed_options``) is taken under the new one, with a FutureWarning."""
    options = dict(options or {})
    for old, new in cls.renamed_options.items():
        if old in options:
            if new in options:
                raise ParadecodeError(f"method {cls.method_name!r} got both {old} and {new}: {old} is the old name "
                                      f"of {new}; give {new} only.")
            warnings.warn(f"option {old} of method {cls.method_name!r} is now called {new}; the old name still "
                          "works but will go away.", FutureWarning, stacklevel=2)
            options[new] = options.pop(old)
    if draft_model and takes_draft_model(cls):
        options.setdefault("draft_model", draft_model)
    return MethodChoice(cls.method_name, cls, options, build_options(cls, options))


def parse_options(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Turn ``["k=v", ...]`` (CLI ``--opt``) into a dict, reading ints, floats and booleans."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ParadecodeError(f"method options take the form key=value, got {pair!r}.")
        options[key.strip().replace("-", "_")] = parse_value(raw.strip())
    return options


def parse_value(raw: str) -> Any:
    """An option value as typed on the command line: a boolean, an int, a float, or else the string itself."""
    lowered = raw.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
