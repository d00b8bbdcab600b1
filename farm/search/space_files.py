"""Reading search space files: YAML, `extends` chains and the spaces shipped with the farm.

    kernel: softmax               # the three-line space: everything else comes from the
    shapes: [[4096, 50257]]       # kernel's shipped space (search_spaces/softmax.yaml)
    dtypes: [bfloat16]

    extends: softmax              # explicitly: a shipped space by name, or a file path
    targets: [gpu-triton]         # relative to this file; fields given here replace the
    params: {num_warps: {values: [4, 8]}}   # base's (params and constraints merge, see merge)

`resolve` returns the document with its chain merged in, for `farm.search.spaces` to validate.
"""
from __future__ import annotations

import os
import re
import stat
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from farm.errors import SpaceError, shorten

# How many spaces one `extends` chain may hold.
MAX_EXTENDS = 8
# Bounds on one space file: its size, nesting depth, aliases (*name) and values (aliases expanded).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ALIASES = 256
MAX_VALUES = 100_000


def shipped_spaces_dir() -> Path:
    """The folder of the search spaces shipped with the farm (one per registered kernel)."""
    return Path(str(resources.files("search_spaces")))


def shipped_space(kernel: str) -> Path | None:
    """The shipped search space of a kernel, or None when it has none."""
    if not re.fullmatch(r"[A-Za-z0-9_]{1,100}", kernel):
        return None  # a module path or anything else is not a shipped space's name
    path = shipped_spaces_dir() / f"{kernel}.yaml"
    return path if path.is_file() else None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounded nesting and alias use (no recursion errors, no alias bombs)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, counting aliases and nesting depth."""
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _TooLarge(f"at most {MAX_ALIASES} aliases (*name)")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooLarge(f"nesting at most {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def flatten_mapping(self, node: Any) -> None:
        """Merge keys (`<<: *base`), bounded: nested merges copy entries and could multiply them."""
        super().flatten_mapping(node)
        if len(node.value) > MAX_VALUES:
            raise _TooLarge(f"at most {MAX_VALUES} entries in a mapping after merge keys (<<)")


class _TooLarge(Exception):
    """A document over one of the bounds; the text says which."""


def _expanded_size(document: Any, limit: int) -> int:
    """How many values `document` holds with aliases expanded (shared parts counted each time they
    appear), counting no further than just past `limit`."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = limit + 1  # a node that holds itself (a recursive alias) is over any limit
        items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        total = 1
        for item in items:
            total += size(item)
            if total > limit:
                break
        sizes[id(node)] = total
        return total

    return size(document)


def read_yaml(path: str) -> Any:
    """The parsed YAML document of a space file; SpaceError when unreadable, malformed or too large.

    Bounds (each a one-line SpaceError): MAX_FILE_BYTES, UTF-8 text, MAX_DEPTH levels of nesting,
    MAX_ALIASES aliases and MAX_VALUES values once aliases are expanded, integers of at most 4300
    digits (Python's own limit on converting text to int).
    """
    try:
        # O_NONBLOCK: a FIFO named as a space must not block the loader forever
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SpaceError(path, "file", "a regular YAML file (not a folder, device or FIFO)")
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SpaceError(path, "file", "a readable YAML file", err.strerror) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpaceError(path, "file", f"a search space of at most {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpaceError(path, "file", f"UTF-8 text (byte {err.start} is not)") from None
    loader = None
    try:
        loader = _BoundedLoader(text)
        document = loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpaceError(path, where, f"well-formed YAML ({shorten(str(problem), 200)})") from None
    except _TooLarge as err:
        mark = loader.get_mark() if loader is not None else None
        where = f"line {mark.line + 1}" if mark else "document"
        raise SpaceError(path, where, f"a YAML document with {err}") from None
    except (ValueError, RecursionError, MemoryError) as err:  # e.g. an integer of 5000 digits
        raise SpaceError(path, "document", f"YAML values of bounded size ({shorten(str(err), 200)})") from None
    finally:
        if loader is not None:
            loader.dispose()
    if _expanded_size(document, MAX_VALUES) > MAX_VALUES:
        raise SpaceError(path, "document", f"at most {MAX_VALUES} values with aliases expanded (alias bomb?)")
    return document


def _base_path(data: dict[str, Any], path: str) -> str | None:
    """The space `data` (read from `path`) builds on: its `extends`, else the kernel's shipped
    space when it names no params; None when it stands alone."""
    base = data.get("extends")
    if base is None:
        if "params" in data or not isinstance(data.get("kernel"), str):
            return None
        shipped = shipped_space(data["kernel"])
        if shipped is None:
            raise SpaceError(path, "params", f"a mapping of knobs (kernel {data['kernel']!r} ships no search space "
                             f"to take them from)")
        return str(shipped)
    if not isinstance(base, str) or not base:
        raise SpaceError(path, "extends", "a shipped space name (e.g. softmax) or a YAML file path", base)
    if base.endswith((".yaml", ".yml")) or "/" in base:
        return str(Path(path).parent / base)
    shipped = shipped_space(base)
    if shipped is None:
        names = sorted(p.stem for p in shipped_spaces_dir().glob("*.yaml"))
        raise SpaceError(path, "extends", f"a shipped space ({', '.join(names)}) or a YAML file path", base)
    return str(shipped)


def _target_names(targets: Any) -> set[str] | None:
    """The target names of a `targets` field (list or mapping); None when it is neither."""
    if isinstance(targets, dict):
        return {str(t) for t in targets}
    if isinstance(targets, list) and all(isinstance(t, str) for t in targets):
        return set(targets)
    return None


def _only_targets(base: dict[str, Any], keep: set[str] | None) -> dict[str, Any]:
    """`base` with its per-target params and constraints cut to the targets in `keep`."""
    if keep is None:
        return base

    def cut(item: Any) -> Any:
        if isinstance(item, dict) and isinstance(item.get("targets"), list):
            targets = [t for t in item["targets"] if t in keep]
            return {**item, "targets": targets} if targets else None
        return item

    cut_base = dict(base)
    if isinstance(base.get("params"), dict):
        cut_base["params"] = {name: spec for name, spec in ((n, cut(v)) for n, v in base["params"].items())
                              if spec is not None}
    if isinstance(base.get("constraints"), list):
        cut_base["constraints"] = [c for c in map(cut, base["constraints"]) if c is not None]
    return cut_base


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` over `base`: the child's fields replace the base's, except that params merge by
    name (the child's entry wins), constraints add up, and the child's top-level shapes or dtypes
    also replace the base's per-target ones (a user's shapes apply to every target). When the
    child names its targets, the base's knobs and constraints for other targets are dropped."""
    if "targets" in child:
        base = _only_targets(base, _target_names(child["targets"]))
    merged = {**base, **{k: v for k, v in child.items() if k not in ("params", "constraints", "extends")}}
    merged.pop("extends", None)
    if isinstance(base.get("params"), dict) and isinstance(child.get("params"), dict):
        merged["params"] = {**base["params"], **child["params"]}
    elif "params" in child:
        merged["params"] = child["params"]
    base_constraints = base.get("constraints") or []
    child_constraints = child.get("constraints") or []
    if isinstance(base_constraints, list) and isinstance(child_constraints, list):
        merged["constraints"] = [*base_constraints, *child_constraints]
    else:
        merged["constraints"] = child_constraints if "constraints" in child else base_constraints
    targets = merged.get("targets")
    if _target_names(child.get("targets")) is not None and isinstance(child.get("targets"), list) \
            and isinstance(base.get("targets"), dict):
        # a list of names picks the base's targets, with their own shapes and dtypes
        targets = merged["targets"] = {name: base["targets"].get(name) for name in child["targets"]}
    if isinstance(targets, dict) and ("targets" not in child or (
            isinstance(child["targets"], list) and _target_names(child["targets"]) is not None)):
        overridden = [f for f in ("shapes", "dtypes") if f in child]
        merged["targets"] = {name: ({k: v for k, v in body.items() if k not in overridden}
                                    if isinstance(body, dict) else body) for name, body in targets.items()}
    return merged


def resolve(data: Any, path: str) -> Any:
    """The document with its `extends` chain merged in (at most MAX_EXTENDS files, no cycles)."""
    chain, merged, raw, current = [path], data, data, path   # raw: the content of file `current`
    while isinstance(raw, dict):
        base_path = _base_path({**raw, "kernel": merged.get("kernel")}, current)
        if base_path is None:
            return merged
        if len(chain) >= MAX_EXTENDS:
            raise SpaceError(path, "extends", f"a chain of at most {MAX_EXTENDS} spaces", " -> ".join(chain))
        try:
            cycle = any(Path(base_path).resolve() == Path(p).resolve() for p in chain)
            readable = Path(base_path).is_file()
        except (OSError, RuntimeError):  # a name too long, a symlink loop
            cycle, readable = False, False
        if cycle:
            raise SpaceError(path, "extends", "no cycle of spaces", " -> ".join([*chain, base_path]))
        if not readable:
            raise SpaceError(current, "extends", "a readable YAML file", base_path)
        base = read_yaml(base_path)
        if not isinstance(base, dict):
            raise SpaceError(base_path, "document", f"a mapping (extended by {current})", type(base).__name__)
        if "kernel" in merged and "kernel" in base and merged["kernel"] != base["kernel"]:
            raise SpaceError(current, "kernel", f"the kernel of the space it extends ({base['kernel']!r} in "
                             f"{base_path})", merged["kernel"])
        chain.append(base_path)
        merged, raw, current = merge(base, merged), base, base_path
    return merged
