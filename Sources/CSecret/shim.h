// The "paths" API (secret-paths.h) is marked unstable but unchanged since libsecret 0.7; it lets the
// broker load all its items in two D-Bus calls instead of one call per item.
#define SECRET_API_SUBJECT_TO_CHANGE 1
#include <libsecret/secret.h>
