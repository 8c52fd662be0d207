// Tessera's libcurl shim: only what Swift cannot call of libcurl. Every symbol is prefixed
// `tessera_`. (System calls Swift cannot reach are in CTesseraSystemShim.)
#ifndef TESSERA_SHIM_H
#define TESSERA_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <curl/curl.h>

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
