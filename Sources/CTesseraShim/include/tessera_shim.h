// Tessera's C shim: only what Swift cannot call directly. Every symbol is prefixed `tessera_`.
#ifndef TESSERA_SHIM_H
#define TESSERA_SHIM_H

#include <malloc.h>  // malloc_trim: <malloc.h> is not part of Swift's Glibc module
#include <stddef.h>
#include <stdint.h>
#include <curl/curl.h>
#include <systemd/sd-bus.h>

// --- sd-bus vtable --------------------------------------------------------------------------
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
/// Size of one vtable entry, for allocation from Swift.
size_t tessera_vtable_entry_size(void);
/// Reason: SD_BUS_VTABLE_PROPERTY_CONST is a macro.
uint64_t tessera_vtable_property_const(void);

// --- libcurl ---------------------------------------------------------------------------------
// Reason: curl_easy_setopt and curl_easy_getinfo are variadic, with no va_list form. libcurl is
// loaded on first use (dlopen, see CurlLibrary.swift), so each call passes the function as found
// by dlsym (`easy_setopt` / `easy_getinfo`); the shim keeps no state.

CURLcode tessera_curl_setopt_long(void *easy_setopt, CURL *handle, CURLoption option, long value);
CURLcode tessera_curl_setopt_string(void *easy_setopt, CURL *handle, CURLoption option, const char *value);
CURLcode tessera_curl_setopt_pointer(void *easy_setopt, CURL *handle, CURLoption option, void *value);
/// For CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION.
CURLcode tessera_curl_setopt_data_callback(void *easy_setopt, CURL *handle, CURLoption option,
                                           size_t (*callback)(char *, size_t, size_t, void *));
CURLcode tessera_curl_getinfo_long(void *easy_getinfo, CURL *handle, CURLINFO info, long *value);

#endif
