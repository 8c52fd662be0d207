"""The running daemon serves exactly the contract in dbus/org.tessera.Broker1.xml."""
import os
import re
import xml.etree.ElementTree as ET

from conftest import ERROR_PREFIX, IFACE, REPO

XML_PATH = os.path.join(REPO, "dbus", "org.tessera.Broker1.xml")
ERRORS_SWIFT = os.path.join(REPO, "Sources", "TesseraInterface", "Errors.swift")


def interface_shape(xml_text, name=IFACE):
    """Methods, signals and properties of one interface; comments and annotations are ignored."""
    root = ET.fromstring(xml_text)
    matches = [i for i in root.findall("interface") if i.get("name") == name]
    assert len(matches) == 1, f"expected one <interface name='{name}'>, found {len(matches)}"
    iface = matches[0]
    methods = {
        m.get("name"): [(a.get("name"), a.get("type"), a.get("direction", "in")) for a in m.findall("arg")]
        for m in iface.findall("method")
    }
    signals = {s.get("name"): [(a.get("name"), a.get("type")) for a in s.findall("arg")] for s in iface.findall("signal")}
    properties = {p.get("name"): (p.get("type"), p.get("access")) for p in iface.findall("property")}
    return {"methods": methods, "signals": signals, "properties": properties}


def test_introspection_matches_contract_file(broker):
    with open(XML_PATH) as f:
        contract = interface_shape(f.read())
    served = interface_shape(broker.introspect())
    # Not vacuous: the contract really describes the broker.
    assert {"AcquireToken", "AcquireTokenSilent", "GetAccounts", "SignOut"} <= set(contract["methods"])
    assert served["methods"] == contract["methods"]
    assert served["signals"] == contract["signals"]
    assert served["properties"] == contract["properties"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", broker.version())


def test_error_names_in_contract_match_the_daemon():
    with open(XML_PATH) as f:
        documented = set(re.findall(re.escape(ERROR_PREFIX) + r"(\w+)", f.read()))
    with open(ERRORS_SWIFT) as f:
        sent = set(re.findall(r'^\s*case\s+`?\w+`?\s*=\s*"(\w+)"', f.read(), re.M))
    assert len(sent) >= 10, f"could not parse the error codes of {ERRORS_SWIFT}: {sent}"
    assert documented == sent, f"only in the XML: {documented - sent}; only in the daemon: {sent - documented}"


MS_XML_PATH = os.path.join(REPO, "dbus", "com.microsoft.identity.broker1.xml")


def test_microsoft_front_introspection_matches_its_contract_file(broker):
    """The same daemon owns com.microsoft.identity.broker1 and serves exactly its XML."""
    from conftest import bus_daemon
    conn, bus = bus_daemon()
    try:
        assert int(bus.GetConnectionUnixProcessID("com.microsoft.identity.broker1")) == int(
            bus.GetConnectionUnixProcessID("org.tessera.Broker1"))
        served = str(conn.call_blocking(
            "com.microsoft.identity.broker1", "/com/microsoft/identity/broker1",
            "org.freedesktop.DBus.Introspectable", "Introspect", "", (), timeout=10))
    finally:
        conn.close()
    with open(MS_XML_PATH) as f:
        contract = interface_shape(f.read(), "com.microsoft.identity.Broker1")
    assert len(contract["methods"]) == 8
    assert interface_shape(served, "com.microsoft.identity.Broker1") == contract
