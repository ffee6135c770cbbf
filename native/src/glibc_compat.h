/* Binary compatibility with glibc 2.28 (manylinux_2_28): glibc 2.34 moved
 * the dl* and pthread_once/create/join functions into libc with new symbol versions, so
 * references are bound to their original versions (kept by newer glibc, and
 * found in libdl.so.2 / libpthread.so.0 by older ones, which the library
 * lists as needed). Included first by every source file (-include). */
#ifndef AOTR_GLIBC_COMPAT_H
#define AOTR_GLIBC_COMPAT_H
#if defined(__GLIBC__) || defined(__linux__)
#if defined(__x86_64__)
#define AOTR_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define AOTR_GLIBC_BASE "GLIBC_2.17"
#endif
#ifdef AOTR_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" AOTR_GLIBC_BASE);
__asm__(".symver dlsym,dlsym@" AOTR_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" AOTR_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" AOTR_GLIBC_BASE);
__asm__(".symver dladdr,dladdr@" AOTR_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" AOTR_GLIBC_BASE);
__asm__(".symver pthread_create,pthread_create@" AOTR_GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" AOTR_GLIBC_BASE);
#endif
#endif
#endif
