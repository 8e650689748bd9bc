"""Placeholder: being written."""

from __future__ import annotations

import argparse
from typing import Any


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    return None
