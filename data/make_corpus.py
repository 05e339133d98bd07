"""Rebuild data/stdlib_docstrings.txt: the docstrings of a fixed list of pure-Python standard-library
modules, in a fixed order, ASCII only.  Run with CPython 3.11 to get the shipped file back byte for byte:
``python data/make_corpus.py``."""

import importlib
import inspect
from pathlib import Path

MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "collections", "configparser", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "email.message", "enum", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html.parser",
    "http.client", "http.server", "imaplib", "inspect", "ipaddress", "json", "logging", "mailbox",
    "mimetypes", "numbers", "optparse", "os", "pathlib", "pdb", "pickle", "pprint", "queue", "random",
    "re", "sched", "shlex", "shutil", "smtplib", "socketserver", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "turtle", "typing",
    "unittest.case", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "zipfile",
)
LIMIT = 1_200_000  # characters: under 2 MB, enough for a character model to learn words


def docstrings(module):
    yield inspect.getdoc(module)
    for name, obj in sorted(vars(module).items()):
        if getattr(obj, "__module__", None) != module.__name__ or name.startswith("_"):
            continue
        if inspect.isclass(obj):
            yield inspect.getdoc(obj)
            for attr, member in sorted(vars(obj).items()):
                if inspect.isfunction(member) and not attr.startswith("_"):
                    yield inspect.getdoc(member)
        elif inspect.isfunction(obj):
            yield inspect.getdoc(obj)


def main():
    seen, parts = set(), []
    for name in MODULES:
        for doc in docstrings(importlib.import_module(name)):
            if not doc or doc in seen:
                continue
            seen.add(doc)
            parts.append("".join(c for c in doc if c == "\n" or 32 <= ord(c) < 127))
    text = "\n\n".join(parts)[:LIMIT]
    out = Path(__file__).with_name("stdlib_docstrings.txt")
    out.write_text(text + "\n", encoding="ascii")
    print(f"{out}: {len(text) + 1} characters from {len(MODULES)} modules")


if __name__ == "__main__":
    main()
