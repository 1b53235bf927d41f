// Symbol visibility for the treecask library.
#pragma once

#if defined(TREECASK_STATIC)
#define TREECASK_API
#elif defined(_WIN32)
#if defined(TREECASK_BUILDING)
#define TREECASK_API __declspec(dllexport)
#else
#define TREECASK_API __declspec(dllimport)
#endif
#else
#define TREECASK_API __attribute__((visibility("default")))
#endif
