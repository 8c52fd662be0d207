#include "tessera_bus_shim.h"

#include <pthread.h>

#include <string.h>

void tessera_vtable_start(sd_bus_vtable *v, uint64_t flags) {
  const sd_bus_vtable e = SD_BUS_VTABLE_START(flags);
  memcpy(v, &e, sizeof e);
}

void tessera_vtable_method(sd_bus_vtable *v, const char *member, const char *signature,
                           const char *result, const char *names,
                           sd_bus_message_handler_t handler, uint64_t flags) {
  const sd_bus_vtable e = {
      .type = _SD_BUS_VTABLE_METHOD,
      .flags = flags,
      .x = {.method = {.member = member,
                       .signature = signature,
                       .result = result,
                       .handler = handler,
                       .offset = 0,
                       .names = names}},
  };
  memcpy(v, &e, sizeof e);
}

void tessera_vtable_property(sd_bus_vtable *v, const char *member, const char *signature,
                             sd_bus_property_get_t getter, uint64_t flags) {
  const sd_bus_vtable e = SD_BUS_PROPERTY(member, signature, getter, 0, flags);
  memcpy(v, &e, sizeof e);
}

void tessera_vtable_signal(sd_bus_vtable *v, const char *member, const char *signature,
                           const char *names, uint64_t flags) {
  const sd_bus_vtable e = {
      .type = _SD_BUS_VTABLE_SIGNAL,
      .flags = flags,
      .x = {.signal = {.member = member, .signature = signature, .names = names}},
  };
  memcpy(v, &e, sizeof e);
}

void tessera_vtable_end(sd_bus_vtable *v) {
  const sd_bus_vtable e = SD_BUS_VTABLE_END;
  memcpy(v, &e, sizeof e);
}

uint64_t tessera_vtable_property_const(void) { return SD_BUS_VTABLE_PROPERTY_CONST; }

uint64_t tessera_vtable_property_emits_change(void) { return SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE; }
