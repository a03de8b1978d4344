/* Run-time ISA detection, the kernel tables and the default path. Detection runs once;
 * ACTCODEC_SIMD sets the default path. No -march flag is used anywhere: SIMD files carry
 * per-function target attributes. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#if !defined(_WIN32)
#include <pthread.h>
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define AC_X86 1
#include <cpuid.h>
#endif

static const char *const isa_names[AC_ISA_COUNT] = {"scalar", "sse2", "avx2", "neon"};

/* Written once by detect() under pthread_once, read-only afterwards. */
static ac_kernels tables[AC_ISA_COUNT];
static int available[AC_ISA_COUNT];
static int best_isa = AC_ISA_SCALAR;
static int init_status = AC_OK;
static char features[160];
/* The default for calls that name no path; set from any thread (ac_set_default_isa). */
static _Atomic int default_isa = AC_ISA_SCALAR;

static void add_feature(const char *name) {
    size_t used = strlen(features);
    if (used + strlen(name) + 2 < sizeof(features)) {
        if (used) strcat(features, " ");
        strcat(features, name);
    }
}

#ifdef AC_X86
static unsigned long long read_xcr0(void) {
    unsigned eax, edx;
    /* xgetbv(0): which register states the OS saves on context switch. */
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

/* The x86 paths: AVX2 needs the CPU bits (with POPCNT and F16C, which every AVX2 CPU has)
 * and OS support for YMM state. */
static void detect_x86(int *has_sse2, int *has_avx2) {
    unsigned a, b, c, d;
    *has_sse2 = *has_avx2 = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int sse2 = (d >> 26) & 1, ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1, sse42 = (c >> 20) & 1;
    int popcnt = (c >> 23) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    int os_avx = osxsave && (read_xcr0() & 6) == 6;
    int avx2 = 0, bmi1 = 0, bmi2 = 0, avx512f = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        avx2 = (b >> 5) & 1;
        bmi1 = (b >> 3) & 1;
        bmi2 = (b >> 8) & 1;
        avx512f = (b >> 16) & 1;
    }
    if (sse2) add_feature("sse2");
    if (ssse3) add_feature("ssse3");
    if (sse41) add_feature("sse4.1");
    if (sse42) add_feature("sse4.2");
    if (popcnt) add_feature("popcnt");
    if (avx && os_avx) add_feature("avx");
    if (f16c && os_avx) add_feature("f16c");
    if (avx2 && os_avx) add_feature("avx2");
    if (bmi1) add_feature("bmi1");
    if (bmi2) add_feature("bmi2");
    if (avx512f) add_feature("avx512f");
    if (!os_avx && avx) add_feature("(avx disabled by the OS)");
    *has_sse2 = sse2;
    *has_avx2 = avx2 && avx && os_avx && popcnt && f16c;
}
#endif

static void detect(void) {
    features[0] = '\0';
    available[AC_ISA_SCALAR] = ac_kernels_scalar(&tables[AC_ISA_SCALAR]);
#ifdef AC_X86
    int sse2, avx2;
    detect_x86(&sse2, &avx2);
    available[AC_ISA_SSE2] = sse2 && ac_kernels_sse2(&tables[AC_ISA_SSE2]);
    available[AC_ISA_AVX2] = avx2 && ac_kernels_avx2(&tables[AC_ISA_AVX2]);
#endif
#if defined(__aarch64__)
    add_feature("neon");
    available[AC_ISA_NEON] = ac_kernels_neon(&tables[AC_ISA_NEON]);
#endif
    /* Every table starts from the scalar quantization kernels; each ISA overrides the ones
     * it accelerates. */
    int (*const quant_isa[AC_ISA_COUNT])(ac_kernels *) = {
        NULL, ac_quant_kernels_sse2, ac_quant_kernels_avx2, ac_quant_kernels_neon};
    for (int i = 0; i < AC_ISA_COUNT; i++) {
        if (!available[i]) continue;
        ac_quant_kernels_scalar(&tables[i]);
        if (quant_isa[i]) quant_isa[i](&tables[i]);
        best_isa = i;
    }
}

static void init_once(void) {
    detect();
    int isa = best_isa;
    const char *forced = getenv("ACTCODEC_SIMD");
    if (forced && *forced) {
        int want = ac_isa_from_name(forced);
        if (want < 0) init_status = AC_EINVAL;
        else if (!available[want]) init_status = AC_EUNSUPPORTED;
        else isa = want;
    }
    atomic_store(&default_isa, isa);
}

int ac_init(void) {
#if defined(_WIN32)
    static volatile long done = 0; /* Windows builds are serial-core, scalar-only */
    if (!done) { init_once(); done = 1; }
#else
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
#endif
    return init_status;
}

const char *ac_isa_name(int isa) {
    return isa >= 0 && isa < AC_ISA_COUNT ? isa_names[isa] : NULL;
}

int ac_isa_from_name(const char *name) {
    for (int i = 0; i < AC_ISA_COUNT; i++)
        if (name && strcmp(name, isa_names[i]) == 0) return i;
    return -1;
}

int ac_isa_available(int isa) {
    ac_init();
    return isa >= 0 && isa < AC_ISA_COUNT && available[isa];
}

int ac_best_isa(void) { ac_init(); return best_isa; }
int ac_default_isa(void) { ac_init(); return atomic_load(&default_isa); }

int ac_set_default_isa(int isa) {
    if (!ac_isa_available(isa)) return AC_EUNSUPPORTED;
    atomic_store(&default_isa, isa);
    return AC_OK;
}

const char *ac_cpu_features(void) { ac_init(); return features; }

int ac_call_from(const ac_options *opt, ac_call *call) {
    static const ac_options defaults = AC_OPTIONS_DEFAULT;
    if (opt == NULL) opt = &defaults;
    int isa = opt->isa == AC_ISA_DEFAULT ? ac_default_isa() : opt->isa;
    if (isa < 0 || isa >= AC_ISA_COUNT || opt->threads < 0 || opt->threads > AC_MAX_THREADS ||
        opt->bittrick < -1 || opt->bittrick > 1)
        return AC_EINVAL;
    if (!ac_isa_available(isa)) return AC_EUNSUPPORTED;
    call->k = &tables[isa];
    call->isa = isa;
    call->threads = opt->threads ? opt->threads : ac_default_threads();
    call->trick = opt->bittrick >= 0 ? opt->bittrick : isa == AC_ISA_SCALAR;
    return AC_OK;
}
