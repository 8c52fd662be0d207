#include "tessera_shim.h"


typedef CURLcode (*tessera_easy_setopt_fn)(CURL *, CURLoption, ...);
typedef CURLcode (*tessera_easy_getinfo_fn)(CURL *, CURLINFO, ...);

CURLcode tessera_curl_setopt_long(void *easy_setopt, CURL *handle, CURLoption option, long value) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, value);
}

CURLcode tessera_curl_setopt_string(void *easy_setopt, CURL *handle, CURLoption option, const char *value) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, value);
}

CURLcode tessera_curl_setopt_pointer(void *easy_setopt, CURL *handle, CURLoption option, void *value) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, value);
}

CURLcode tessera_curl_setopt_data_callback(void *easy_setopt, CURL *handle, CURLoption option,
                                           size_t (*callback)(char *, size_t, size_t, void *)) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, callback);
}

CURLcode tessera_curl_getinfo_long(void *easy_getinfo, CURL *handle, CURLINFO info, long *value) {
  return ((tessera_easy_getinfo_fn)easy_getinfo)(handle, info, value);
}
