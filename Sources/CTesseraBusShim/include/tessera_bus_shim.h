// Tessera's sd-bus shim: only what Swift cannot call directly. Every symbol is prefixed `tessera_`.
#ifndef TESSERA_BUS_SHIM_H
#define TESSERA_BUS_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

// Reason: SD_BUS_VTABLE_START/METHOD/PROPERTY/SIGNAL/END are macros filling a struct with
// bit-fields and a union, which Swift cannot build.

/// Fills `v` with the vtable start entry.
void tessera_vtable_start(sd_bus_vtable *v, uint64_t flags);
/// Fills `v` with a method; `names` holds the input then output argument names, each ended by NUL.
void tessera_vtable_method(sd_bus_vtable *v, const char *member, const char *signature,
                           const char *result, const char *names,
                           sd_bus_message_handler_t handler, uint64_t flags);
/// Fills `v` with a read-only property served by `getter`.
void tessera_vtable_property(sd_bus_vtable *v, const char *member, const char *signature,
                             sd_bus_property_get_t getter, uint64_t flags);
/// Fills `v` with a signal; `names` as for methods.
void tessera_vtable_signal(sd_bus_vtable *v, const char *member, const char *signature,
                           const char *names, uint64_t flags);
/// Fills `v` with the end entry.
void tessera_vtable_end(sd_bus_vtable *v);
/// Reason: SD_BUS_VTABLE_PROPERTY_CONST is a macro.
uint64_t tessera_vtable_property_const(void);
/// SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE: a macro (an enum bit shifted), so not visible to Swift.
uint64_t tessera_vtable_property_emits_change(void);

#endif
