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
	@echo "bench: not yet: there are no benchmarks yet."

install:
	scripts/install --prefix "$(PREFIX)" --destdir "$(DESTDIR)"

check-units:
	scripts/check-units
