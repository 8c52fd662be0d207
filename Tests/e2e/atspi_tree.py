#!/usr/bin/python3
"""Prints the accessibility tree of a running app, as assistive technologies see it through AT-SPI:
a JSON list of {role, name, depth, states} in document order, or null when no app of that name is
on the accessibility bus. Run with Debian's python3 (pyatspi comes from python3-pyatspi).

Usage: atspi_tree.py APP_NAME
"""
import json
import sys

import pyatspi


def walk(node, depth=0):
    try:
        states = sorted(pyatspi.stateToString(s) for s in node.getState().getStates())
    except Exception:  # noqa: BLE001 (a node that went away while read)
        states = []
    yield {"role": node.getRoleName(), "name": node.name or "", "depth": depth, "states": states}
    for i in range(node.childCount):
        child = node.getChildAtIndex(i)
        if child is not None:
            yield from walk(child, depth + 1)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    desktop = pyatspi.Registry.getDesktop(0)
    for i in range(desktop.childCount):
        app = desktop.getChildAtIndex(i)
        if app is not None and app.name == sys.argv[1]:
            print(json.dumps(list(walk(app))))
            return
    print("null")


if __name__ == "__main__":
    main()
