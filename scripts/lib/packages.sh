# Sourced, not run. The one list of Debian packages Tessera needs, and the one function that
# installs them. Every script that builds Tessera or runs it calls this before anything else, so a
# fresh Debian 12 with Swift works as the README says (scripts/setup, scripts/test, scripts/demo,
# scripts/bench, scripts/install). Tests/scripts checks that each script the README names does.

# To build tesserad and tessera: the headers of the C libraries they reach.
# tpm2-tss's headers too (its libraries are loaded only where a TPM is used; libtss2-dev pulls
# them in for the tests).
TESSERA_BUILD_PACKAGES=(libsystemd-dev libsecret-1-dev libcurl4-openssl-dev libtss2-dev)
# To run them in a private headless session with the test IdP (scripts/test-session, scripts/idp).
TESSERA_SESSION_PACKAGES=(ca-certificates git gnome-keyring dbus-daemon dbus dbus-bin libglib2.0-bin python3-dbus python3-venv
    openssl systemd)
# The real programs the helpers serve (Tests/e2e/test_integrations.py), GLib's Python bindings
# for the test's notification server and portal backend, and bubblewrap, the sandbox Flatpak runs
# apps in (the Flatpak-like caller of Tests/e2e/test_access.py). kubectl is not in Debian 12 under
# that name: its kubernetes-client package provides it (tessera_install_kubectl). libfaketime
# (faketime) sets tesserad's wall clock alone, for the clock faults (Tests/e2e/test_faults_clock.py).
TESSERA_HELPER_PACKAGES=(msmtp python3-gi bubblewrap faketime)
# For the unit tests of the man pages (Tests/TesseraCLITests/ManPageTests.swift runs
# `man --warnings` on docs/man/*): man-db's man(1) and the groff it formats with.
# swtpm: a software TPM 2.0 for the tests of keys kept in a TPM (TPMProofKeysTests, test_dpop).
TESSERA_TEST_PACKAGES=(man-db groff-base swtpm swtpm-tools)
# To build the Debian packages and check them (scripts/package), and to try them on a Debian 12
# root of their own with no Swift (Tests/e2e/test_package.py: debootstrap makes it, bubblewrap
# enters it).
TESSERA_PACKAGE_PACKAGES=(dpkg-dev fakeroot lintian debootstrap)
# OpenSSH's server and client, for the tests of `tessera forward` (Tests/e2e/test_forward.py runs
# an sshd of its own on 127.0.0.1, never the system's service). Not in the lists every script
# installs: on a desktop, where systemd runs as init, the package would enable and start sshd on
# port 22. tessera_install_test_sshd installs it only where no systemd runs (a container, CI).
TESSERA_SSH_TEST_PACKAGES=(openssh-server openssh-client)
# A real third-party plain OAuth 2.0 server, glewlwyd's OAuth 2.0 plugin, for
# Tests/e2e/test_glewlwyd.py (which starts a glewlwyd of its own on 127.0.0.1, never the system's
# service). dbconfig-no-thanks, and glewlwyd's debconf question answered "No configuration" first,
# keep its post-install from setting up a database through a dialog, which fails without a terminal
# (tessera_install_glewlwyd).
TESSERA_GLEWLWYD_PACKAGES=(glewlwyd dbconfig-no-thanks)
# For the real MSAL Python broker client (Tests/msal): pymsalruntime's native libraries, and
# unshare + ip for the private network namespace the test runs in (scripts/msal-session).
TESSERA_MSAL_PACKAGES=(libwebkit2gtk-4.1-0 libsoup-3.0-0 libjavascriptcoregtk-4.1-0 util-linux iproute2)
# The desktop app (Desktop/, tessera-accounts: GTK 4.8 and libadwaita 1.2), and its tests: an X
# server of its own (Xvfb), read through AT-SPI with Debian's pyatspi, screenshots with ImageMagick.
# Never in the lists that tesserad and tessera build with: they do not link GTK.
TESSERA_DESKTOP_PACKAGES=(libgtk-4-dev libadwaita-1-dev xvfb xauth at-spi2-core python3-pyatspi gir1.2-atspi-2.0
    imagemagick fonts-dejavu-core adwaita-icon-theme desktop-file-utils appstream xdotool)

# tessera_is_installed NAME: whether the package is installed (not merely known to dpkg: a package
# removed with its configuration left is "deinstall ok config-files", and `dpkg -s` still succeeds).
tessera_is_installed() {
    dpkg -s "$1" 2>/dev/null | grep -qx "Status: install ok installed"
}

# tessera_install_packages NAME...: installs those of NAME... that are missing (apt-get, as root or
# through sudo). Prints what it does; returns non-zero when it could not.
tessera_install_packages() {
    local missing=() p sudo=()
    for p in "$@"; do
        tessera_is_installed "$p" || missing+=("$p")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "all $# Debian packages are installed"
        return 0
    fi
    echo "installing Debian packages: ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        if ! command -v sudo >/dev/null; then
            echo "not root and no sudo: install these first: ${missing[*]}" >&2
            return 1
        fi
        sudo=(sudo)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# tessera_install_kubectl: Debian's kubernetes-client when no kubectl is on PATH (a newer kubectl
# from elsewhere is kept: the tests use ExecCredential v1 and interactiveMode with 1.22 and later).
tessera_install_kubectl() {
    if command -v kubectl >/dev/null; then
        echo "kubectl is installed: $(command -v kubectl)"
        return 0
    fi
    tessera_install_packages kubernetes-client
}

# tessera_install_quietly PRESEED LINKS PACKAGE...: installs PACKAGE... without starting or
# enabling the services they bring (the tests start their own servers): PRESEED (a debconf line, or
# "") is set first; a policy-rc.d refuses every service start during the install (a container's own
# is kept); the unit links LINKS (space-separated) the install made are removed after it.
tessera_install_quietly() {
    local preseed="$1" links="$2" sudo=() rc=0 made_policy=0
    shift 2
    if tessera_is_installed "$1"; then
        echo "$1 is installed"
        return 0
    fi
    if [[ $(id -u) -ne 0 ]]; then
        if ! command -v sudo >/dev/null; then
            echo "not root and no sudo: install these first: $*" >&2
            return 1
        fi
        sudo=(sudo)
    fi
    if [[ -n "$preseed" ]]; then
        echo "$preseed" | "${sudo[@]}" debconf-set-selections || return 1
    fi
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\n# scripts/lib/packages.sh: no service starts while %s is installed\nexit 101\n' "$1" |
            "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null && "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d &&
            made_policy=1
    fi
    tessera_install_packages "$@" || rc=$?
    if [[ $made_policy -eq 1 ]]; then
        "${sudo[@]}" rm -f /usr/sbin/policy-rc.d
    fi
    # Only links this install made: the package is there now and was not before.
    if [[ $rc -eq 0 ]] && tessera_is_installed "$1"; then
        # shellcheck disable=SC2086
        "${sudo[@]}" rm -f $links
    fi
    return $rc
}

# tessera_install_test_sshd: TESSERA_SSH_TEST_PACKAGES, only where systemd is not init (else the
# forward tests skip and say how to enable them), and without enabling or starting an sshd service
# (the tests start /usr/sbin/sshd themselves).
tessera_install_test_sshd() {
    if [[ -d /run/systemd/system ]] && ! tessera_is_installed openssh-server; then
        echo "openssh-server not installed: systemd runs as init here, and the package would start sshd on" \
            "port 22; Tests/e2e/test_forward.py skips its ssh tests (install openssh-server yourself to run them)"
        return 0
    fi
    tessera_install_quietly "" \
        "/etc/systemd/system/multi-user.target.wants/ssh.service /etc/systemd/system/sshd.service" \
        "${TESSERA_SSH_TEST_PACKAGES[@]}"
}

# tessera_install_glewlwyd: TESSERA_GLEWLWYD_PACKAGES, its debconf question answered before apt-get
# runs ("No configuration": no database set up through a dialog), and without the system service
# the package enables and starts (the tests start their own glewlwyd).
tessera_install_glewlwyd() {
    tessera_install_quietly "glewlwyd glewlwyd/config_type select No configuration" \
        "/etc/systemd/system/multi-user.target.wants/glewlwyd.service" "${TESSERA_GLEWLWYD_PACKAGES[@]}"
}
