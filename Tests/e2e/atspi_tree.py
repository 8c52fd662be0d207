#!/usr/bin/python3
"""Prints the accessibility tree of a running app, as assistive technologies see it through AT-SPI:
a JSON list of {role, name, depth, states} in document order, or null when no app of that name is
on the accessibility bus. With --press NAME, presses the control with that accessible name (its
first action, as a screen reader's user or a switch device would) and prints true, or false when
there is none. Run with Debian's python3 (pyatspi comes from python3-pyatspi).

With --focused, prints the accessible name of the node that has the keyboard focus (null when none).

Usage: atspi_tree.py APP_NAME [--press NAME | --focused]
"""
import json
import sys

import pyatspi


def children(node):
    """The node's children as they are now: a row the app replaces while it is read is gone from
    the accessibility bus ("The application no longer exists"), and is skipped, not an error."""
    try:
        count = node.childCount
    except Exception:  # noqa: BLE001
        return []
    found = []
    for i in range(count):
        try:
            child = node.getChildAtIndex(i)
        except Exception:  # noqa: BLE001
            continue
        if child is not None:
            found.append(child)
    return found


def walk(node, depth=0):
    try:
        entry = {"role": node.getRoleName(), "name": node.name or "", "depth": depth}
    except Exception:  # noqa: BLE001 (gone while read)
        return
    try:
        entry["states"] = sorted(pyatspi.stateToString(s) for s in node.getState().getStates())
    except Exception:  # noqa: BLE001
        entry["states"] = []
    yield entry
    for child in children(node):
        yield from walk(child, depth + 1)


def nodes(node):
    yield node
    for child in children(node):
        yield from nodes(child)


def spoken(name):
    """A button's name as it is meant: GTK 4.8 names a button whose label is a child after both
    ("Cancel Cancel")."""
    half = len(name) // 2
    return name[:half] if len(name) % 2 == 1 and name[half] == " " and name[:half] == name[half + 1:] else name


def press(app, name):
    for node in nodes(app):
        # Buttons only (a label may answer an action too), and only what is shown (GTK 4.8
        # reports visible, not showing).
        try:
            if (node.getRoleName() in ("push button", "toggle button", "page tab", "check box") and spoken(node.name) == name
                    and node.getState().contains(pyatspi.STATE_VISIBLE)):
                action = node.queryAction()
                if action.nActions > 0:
                    return bool(action.doAction(0))
        except Exception:  # noqa: BLE001 (gone while read: the caller asks again)
            continue
    return False


def focused(app):
    for node in nodes(app):
        try:
            if node.getState().contains(pyatspi.STATE_FOCUSED) and node.getRoleName() != "frame":
                return spoken(node.name or "") or node.getRoleName()
        except Exception:  # noqa: BLE001
            continue
    return None


def main():
    args = sys.argv[1:]
    ok = len(args) == 1 or (len(args) == 3 and args[1] == "--press") or (len(args) == 2 and args[1] == "--focused")
    if not ok:
        sys.exit(__doc__.strip())
    desktop = pyatspi.Registry.getDesktop(0)
    for i in range(desktop.childCount):
        app = desktop.getChildAtIndex(i)
        if app is not None and app.name == args[0]:
            if len(args) == 3:
                print(json.dumps(press(app, args[2])))
            elif len(args) == 2:
                print(json.dumps(focused(app)))
            else:
                print(json.dumps(list(walk(app))))
            return
    print("null")


if __name__ == "__main__":
    main()
