# Convenience targets; the real work is in scripts/.
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: build test demo bench install check-units

build:
	swift build

test:
	scripts/test

demo:
	scripts/demo

bench:
	scripts/bench

install:
	scripts/install --prefix "$(PREFIX)" --destdir "$(DESTDIR)"

check-units:
	scripts/check-units
