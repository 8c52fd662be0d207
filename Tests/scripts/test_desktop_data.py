"""The desktop app's files for the desktop (Desktop/data): its .desktop entry and AppStream
metainfo pass the validators distributions run (desktop-file-validate, appstreamcli), and they agree
with each other, with the D-Bus activation file and with the app's GApplication id."""
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "Desktop", "data")
APP_ID = "org.tessera.Accounts"


def read(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils not installed")
def test_the_desktop_entry_is_valid():
    out = subprocess.run(["desktop-file-validate", os.path.join(DATA, APP_ID + ".desktop")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("appstreamcli") is None, reason="appstream not installed")
def test_the_appstream_metainfo_is_valid():
    out = subprocess.run(["appstreamcli", "validate", "--no-net", os.path.join(DATA, APP_ID + ".metainfo.xml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_files_name_the_same_app_as_the_code():
    source = read(os.path.join("..", "Sources", "TesseraAccountsUI", "AccountsApp.swift"))
    assert f'applicationID = "{APP_ID}"' in source
    entry = read(APP_ID + ".desktop")
    assert "Icon=" + APP_ID in entry.splitlines() and "DBusActivatable=true" in entry.splitlines()
    assert "Exec=tessera-accounts" in entry.splitlines()
    component = ET.fromstring(read(APP_ID + ".metainfo.xml"))
    assert component.findtext("id") == APP_ID
    assert component.find("launchable").text == APP_ID + ".desktop"
    assert component.find("provides/binary").text == "tessera-accounts"
    # DBusActivatable needs a service of the same name that starts the app as a GApplication service.
    service = read(APP_ID + ".service")
    assert re.search(rf"^Name={re.escape(APP_ID)}$", service, re.M)
    assert re.search(r"^Exec=/usr/bin/tessera-accounts --gapplication-service$", service, re.M)
    assert read(APP_ID + ".svg").lstrip().startswith("<svg")
