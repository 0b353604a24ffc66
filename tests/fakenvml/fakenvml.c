/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml binding loads it through
 * LD_LIBRARY_PATH and calls it with NVML's real signatures, structs and error codes.
 *
 * Built with -DFAKENVML_MINIMAL it exports only initialisation, enumeration, names, UUIDs and
 * nvmlDeviceGetUtilizationRates, like an old or partial driver: the agent must cope.
 *
 * Driven by the scenario file named by $FAKE_NVML_SCENARIO (format: tests/fakenvml/README.md).
 * The file is re-read when its modification time changes, so a test can change
 * processes, utilisation or errors while an agent runs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define MAX_DEVICES 64
#define MAX_PROCS 256
#define MAX_PATTERN 32
#define SAMPLE_PERIOD_US 166667ULL /* NVML keeps about six utilisation samples a second */
#define DEFAULT_BUFFER_SAMPLES 84 /* samples a utilisation buffer holds (driver key buffer_samples): 14 s, as an H200's */

/*
 * What each call costs on a real driver, in microseconds of the caller's CPU (bench/README.md: an H200 and
 * an H100 with driver 580): spent in a busy loop, so the agent's CPU on the fake is what it would be on a GPU
 * node. Driver keys of the same names set them; cost_scale=0 (or FAKE_NVML_COST_SCALE=0) turns them off.
 */
#define COST_SAMPLES_US 2530.0      /* nvmlDeviceGetSamples, one call with a buffer */
#define COST_SAMPLES_SIZE_US 280.0  /* nvmlDeviceGetSamples asked for the count only (pynvml's first call) */
#define COST_ENERGY_US 2810.0       /* nvmlDeviceGetTotalEnergyConsumption */
#define COST_PROCESS_UTIL_US 2440.0 /* nvmlDeviceGetProcessUtilization */
#define COST_PCIE_US 780.0          /* nvmlDeviceGetPcieThroughput (besides its 20 ms wait) */
#define COST_MIG_MODE_US 140.0      /* nvmlDeviceGetMigMode */
#define COST_CALL_US 3.0            /* every other per-device call: memory, power, clocks, processes, ... */

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct device {
    int in_use;
    char uuid[96];
    char name[96];
    int parent; /* index into devices[] of the parent GPU, -1 for a physical GPU */
    unsigned int index;
    unsigned long long memory_total_mib, memory_used_mib;
    unsigned int power_mw, power_limit_mw;
    unsigned long long energy_mj;
    unsigned int temperature_c, sm_clock_mhz, mem_clock_mhz, pcie_rx_kbs, pcie_tx_kbs;
    unsigned int util[MAX_PATTERN];
    int util_count;
    int instant_util; /* -1: first pattern value */
    unsigned int mem_util;
    int samples;      /* 0: nvmlDeviceGetSamples finds nothing (forces the fallback) */
    int proc_util;    /* 0: nvmlDeviceGetProcessUtilization is not supported */
    int error;        /* every per-device call returns this when non-zero */
    int open_error;   /* nvmlDeviceGetHandleByIndex returns this when non-zero (a GPU lost before it is opened) */
    double lost_after_s; /* < 0: never */
    unsigned int gi, ci, slices;
} device_t;

typedef struct {
    int device;
    unsigned int pid;
    unsigned long long used_mib;
    int sm; /* -1: no per-process sample */
    unsigned int mem;
    int listed; /* 0: left out of the running-process list (another PID namespace), still in per-process samples */
} proc_t;

static device_t devices[MAX_DEVICES];
static int device_count;
static proc_t procs[MAX_PROCS];
static int proc_count;
static int init_error;
static char driver_version[80] = "550.54.15";
static long long scenario_mtime_ns = -1;
static struct timespec start_time;
static int initialised;
static int buffer_samples = DEFAULT_BUFFER_SAMPLES;
static double cost_scale = 1.0, samples_cost_us = COST_SAMPLES_US, samples_size_cost_us = COST_SAMPLES_SIZE_US,
              energy_cost_us = COST_ENERGY_US, process_utilization_cost_us = COST_PROCESS_UTIL_US,
              pcie_cost_us = COST_PCIE_US, mig_mode_cost_us = COST_MIG_MODE_US, call_cost_us = COST_CALL_US;

static void default_costs(void) {
    const char *scale = getenv("FAKE_NVML_COST_SCALE");
    cost_scale = scale ? atof(scale) : 1.0;
    samples_cost_us = COST_SAMPLES_US;
    samples_size_cost_us = COST_SAMPLES_SIZE_US;
    energy_cost_us = COST_ENERGY_US;
    process_utilization_cost_us = COST_PROCESS_UTIL_US;
    pcie_cost_us = COST_PCIE_US;
    mig_mode_cost_us = COST_MIG_MODE_US;
    call_cost_us = COST_CALL_US;
    buffer_samples = DEFAULT_BUFFER_SAMPLES;
}

/* Spend `us` microseconds of this thread's CPU (times cost_scale), as the driver's call would. */
static void spend(double us) {
    us *= cost_scale;
    if (us <= 0) return;
    struct timespec start, now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while ((double)(now.tv_sec - start.tv_sec) * 1e6 + (double)(now.tv_nsec - start.tv_nsec) / 1e3 < us);
}

static double elapsed_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start_time.tv_sec) + (double)(now.tv_nsec - start_time.tv_nsec) / 1e9;
}

__attribute__((unused)) static unsigned long long now_us(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000ULL;
}

static int find_device(const char *uuid) {
    for (int i = 0; i < device_count; i++)
        if (strcmp(devices[i].uuid, uuid) == 0) return i;
    return -1;
}

static void parse_pattern(device_t *d, const char *value) {
    /* no strtok here: the caller is in the middle of its own strtok over the line */
    d->util_count = 0;
    const char *cursor = value;
    while (*cursor && d->util_count < MAX_PATTERN) {
        char *end;
        long parsed = strtol(cursor, &end, 10);
        if (end == cursor) break;
        d->util[d->util_count++] = (unsigned int)parsed;
        cursor = *end == '/' ? end + 1 : end;
    }
}

static void set_device_key(device_t *d, const char *key, const char *value) {
    if (!strcmp(key, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", value);
    else if (!strcmp(key, "name")) {
        snprintf(d->name, sizeof d->name, "%s", value);
        for (char *c = d->name; *c; c++) if (*c == '_') *c = ' ';
    }
    else if (!strcmp(key, "parent")) d->parent = find_device(value);
    else if (!strcmp(key, "memory_total_mib")) d->memory_total_mib = strtoull(value, NULL, 10);
    else if (!strcmp(key, "memory_used_mib")) d->memory_used_mib = strtoull(value, NULL, 10);
    else if (!strcmp(key, "power_mw")) d->power_mw = (unsigned int)atoi(value);
    else if (!strcmp(key, "power_limit_mw")) d->power_limit_mw = (unsigned int)atoi(value);
    else if (!strcmp(key, "energy_mj")) d->energy_mj = strtoull(value, NULL, 10);
    else if (!strcmp(key, "temperature_c")) d->temperature_c = (unsigned int)atoi(value);
    else if (!strcmp(key, "sm_clock_mhz")) d->sm_clock_mhz = (unsigned int)atoi(value);
    else if (!strcmp(key, "mem_clock_mhz")) d->mem_clock_mhz = (unsigned int)atoi(value);
    else if (!strcmp(key, "pcie_rx_kbs")) d->pcie_rx_kbs = (unsigned int)atoi(value);
    else if (!strcmp(key, "pcie_tx_kbs")) d->pcie_tx_kbs = (unsigned int)atoi(value);
    else if (!strcmp(key, "util")) parse_pattern(d, value);
    else if (!strcmp(key, "instant_util")) d->instant_util = atoi(value);
    else if (!strcmp(key, "mem_util")) d->mem_util = (unsigned int)atoi(value);
    else if (!strcmp(key, "samples")) d->samples = atoi(value);
    else if (!strcmp(key, "proc_util")) d->proc_util = atoi(value);
    else if (!strcmp(key, "error")) d->error = atoi(value);
    else if (!strcmp(key, "open_error")) d->open_error = atoi(value);
    else if (!strcmp(key, "lost_after_s")) d->lost_after_s = atof(value);
    else if (!strcmp(key, "gi")) d->gi = (unsigned int)atoi(value);
    else if (!strcmp(key, "ci")) d->ci = (unsigned int)atoi(value);
    else if (!strcmp(key, "slices")) d->slices = (unsigned int)atoi(value);
    else fprintf(stderr, "fakenvml: unknown device key %s\n", key);
}

static void load_scenario(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path) return;
    struct stat info;
    if (stat(path, &info) != 0) return;
    long long mtime_ns = (long long)info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec;
    if (mtime_ns == scenario_mtime_ns) return;
    FILE *file = fopen(path, "r");
    if (!file) return;
    scenario_mtime_ns = mtime_ns;
    device_count = 0;
    proc_count = 0;
    init_error = 0;
    default_costs();
    unsigned int physical = 0;
    char line[2048];
    while (fgets(line, sizeof line, file)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *kind = strtok(line, " \t\r\n");
        if (!kind) continue;
        if (!strcmp(kind, "driver")) {
            for (char *token = strtok(NULL, " \t\r\n"); token; token = strtok(NULL, " \t\r\n")) {
                char *eq = strchr(token, '=');
                if (!eq) continue;
                *eq = 0;
                if (!strcmp(token, "init_error")) init_error = atoi(eq + 1);
                else if (!strcmp(token, "version")) snprintf(driver_version, sizeof driver_version, "%s", eq + 1);
                else if (!strcmp(token, "buffer_samples")) buffer_samples = atoi(eq + 1);
                else if (!strcmp(token, "cost_scale") && !getenv("FAKE_NVML_COST_SCALE")) cost_scale = atof(eq + 1);
                else if (!strcmp(token, "samples_cost_us")) samples_cost_us = atof(eq + 1);
                else if (!strcmp(token, "samples_size_cost_us")) samples_size_cost_us = atof(eq + 1);
                else if (!strcmp(token, "energy_cost_us")) energy_cost_us = atof(eq + 1);
                else if (!strcmp(token, "process_utilization_cost_us")) process_utilization_cost_us = atof(eq + 1);
                else if (!strcmp(token, "pcie_cost_us")) pcie_cost_us = atof(eq + 1);
                else if (!strcmp(token, "mig_mode_cost_us")) mig_mode_cost_us = atof(eq + 1);
                else if (!strcmp(token, "call_cost_us")) call_cost_us = atof(eq + 1);
            }
        } else if ((!strcmp(kind, "gpu") || !strcmp(kind, "mig")) && device_count < MAX_DEVICES) {
            device_t *d = &devices[device_count];
            memset(d, 0, sizeof *d);
            d->in_use = 1;
            d->parent = -1;
            d->instant_util = -1;
            d->samples = 1;
            d->proc_util = 1;
            d->lost_after_s = -1;
            d->memory_total_mib = 81559;
            snprintf(d->name, sizeof d->name, "NVIDIA H100 80GB HBM3");
            for (char *token = strtok(NULL, " \t\r\n"); token; token = strtok(NULL, " \t\r\n")) {
                char *eq = strchr(token, '=');
                if (!eq) continue;
                *eq = 0;
                set_device_key(d, token, eq + 1);
            }
            if (!strcmp(kind, "gpu")) d->index = physical++;
            else if (d->parent >= 0) d->index = devices[d->parent].index;
            device_count++;
        } else if (!strcmp(kind, "proc") && proc_count < MAX_PROCS) {
            proc_t *p = &procs[proc_count];
            memset(p, 0, sizeof *p);
            p->device = -1;
            p->sm = -1;
            p->listed = 1;
            for (char *token = strtok(NULL, " \t\r\n"); token; token = strtok(NULL, " \t\r\n")) {
                char *eq = strchr(token, '=');
                if (!eq) continue;
                *eq = 0;
                const char *value = eq + 1;
                if (!strcmp(token, "device")) p->device = find_device(value);
                else if (!strcmp(token, "pid")) p->pid = (unsigned int)atoi(value);
                else if (!strcmp(token, "used_mib")) p->used_mib = strtoull(value, NULL, 10);
                else if (!strcmp(token, "sm")) p->sm = atoi(value);
                else if (!strcmp(token, "mem")) p->mem = (unsigned int)atoi(value);
                else if (!strcmp(token, "listed")) p->listed = atoi(value);
            }
            if (p->device >= 0) proc_count++;
        }
    }
    fclose(file);
}

/* The device behind a handle, or an error for a bad or failing one. */
static nvmlReturn_t check(void *handle, device_t **out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    device_t *d = (device_t *)handle;
    if (d < devices || d >= devices + MAX_DEVICES || !d->in_use) return NVML_ERROR_INVALID_ARGUMENT;
    spend(call_cost_us);
    if (d->error) return d->error;
    if (d->lost_after_s >= 0 && elapsed_s() >= d->lost_after_s) return NVML_ERROR_GPU_IS_LOST;
    if (d->parent >= 0) {
        device_t *parent = &devices[d->parent];
        if (parent->error) return parent->error;
        if (parent->lost_after_s >= 0 && elapsed_s() >= parent->lost_after_s) return NVML_ERROR_GPU_IS_LOST;
    }
    *out = d;
    return NVML_SUCCESS;
}

#define DEVICE_OR_RETURN(handle)                  \
    device_t *d = NULL;                           \
    {                                             \
        nvmlReturn_t status_ = check(handle, &d); \
        if (status_ != NVML_SUCCESS) return status_; \
    }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load_scenario();
    if (init_error) return init_error;
    clock_gettime(CLOCK_MONOTONIC, &start_time);
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    snprintf(version, length, "%s", driver_version);
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    load_scenario();
    unsigned int n = 0;
    for (int i = 0; i < device_count; i++)
        if (devices[i].parent < 0) n++;
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < device_count; i++) {
        if (devices[i].parent < 0 && devices[i].index == index) {
            if (devices[i].open_error) return devices[i].open_error;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
    /* the UUID stays readable on a failing GPU, as with the real driver's cached identity */
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    device_t *d = (device_t *)handle;
    if (d < devices || d >= devices + MAX_DEVICES || !d->in_use) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(uuid, length, "%s", d->uuid);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
    DEVICE_OR_RETURN(handle);
    snprintf(name, length, "%s", d->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(void *handle, unsigned int *index) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    device_t *d = (device_t *)handle;
    if (d < devices || d >= devices + MAX_DEVICES || !d->in_use) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
    DEVICE_OR_RETURN(handle);
    memory->total = d->memory_total_mib * 1048576ULL;
    memory->used = d->memory_used_mib * 1048576ULL;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *memory) {
    DEVICE_OR_RETURN(handle);
    memory->total = d->memory_total_mib * 1048576ULL;
    memory->used = d->memory_used_mib * 1048576ULL;
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *utilization) {
    DEVICE_OR_RETURN(handle);
    utilization->gpu = d->instant_util >= 0 ? (unsigned int)d->instant_util : (d->util_count ? d->util[0] : 0);
    utilization->memory = d->mem_util;
    return NVML_SUCCESS;
}

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetSamples(void *handle, int type, unsigned long long last_seen, int *value_type,
                                  unsigned int *count, nvmlSample_t *samples) {
    DEVICE_OR_RETURN(handle);
    if (type != 1 && type != 2) return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long now = now_us(); /* the samples as of the call's start: its cost does not add one */
    spend((samples == NULL ? samples_size_cost_us : samples_cost_us) - call_cost_us);
    if (!d->samples) return NVML_ERROR_NOT_FOUND;
    /* the buffer holds the latest buffer_samples samples: older ones are gone */
    unsigned long long oldest = now - (unsigned long long)(buffer_samples > 0 ? buffer_samples : 0) * SAMPLE_PERIOD_US;
    if (last_seen > oldest) oldest = last_seen;
    unsigned long long first = oldest / SAMPLE_PERIOD_US + 1, last = now / SAMPLE_PERIOD_US;
    unsigned int available = last >= first ? (unsigned int)(last - first + 1) : 0;
    *value_type = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (samples == NULL) {
        *count = available;
        return available ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
    }
    if (*count < available) { /* as NVML's list calls do: the size needed, nothing copied */
        *count = available;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int n = available;
    unsigned long long start = last + 1 - n;
    for (unsigned int i = 0; i < n; i++) {
        unsigned long long k = start + i;
        samples[i].timeStamp = k * SAMPLE_PERIOD_US;
        if (type == 1)
            samples[i].sampleValue.uiVal = d->util_count ? d->util[k % (unsigned long long)d->util_count] : 0;
        else
            samples[i].sampleValue.uiVal = d->mem_util;
    }
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetPowerUsage(void *handle, unsigned int *power) {
    DEVICE_OR_RETURN(handle);
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *power = d->power_mw;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *handle, unsigned int *limit) {
    DEVICE_OR_RETURN(handle);
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *limit = d->power_limit_mw;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *handle, unsigned long long *energy) {
    DEVICE_OR_RETURN(handle);
    spend(energy_cost_us - call_cost_us);
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *energy = d->energy_mj + (unsigned long long)((double)d->power_mw * elapsed_s());
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetTemperature(void *handle, int sensor, unsigned int *temperature) {
    DEVICE_OR_RETURN(handle);
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *temperature = d->temperature_c;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetClockInfo(void *handle, int type, unsigned int *clock) {
    DEVICE_OR_RETURN(handle);
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (type == 1) *clock = d->sm_clock_mhz;
    else if (type == 2) *clock = d->mem_clock_mhz;
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetPcieThroughput(void *handle, int counter, unsigned int *value) {
    DEVICE_OR_RETURN(handle);
    spend(pcie_cost_us - call_cost_us);
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    usleep(20000); /* the real call counts bytes for 20 ms before it returns */
    if (counter == 0) *value = d->pcie_tx_kbs;
    else if (counter == 1) *value = d->pcie_rx_kbs;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}
#endif

/* with_sm: the processes with a per-process sample (listed or not); else those the running list shows */
__attribute__((unused)) static int procs_on(const device_t *d, proc_t **out, int with_sm) {
    int n = 0;
    for (int i = 0; i < proc_count; i++) {
        if (&devices[procs[i].device] != d) continue;
        if (with_sm && procs[i].sm < 0) continue;
        if (!with_sm && !procs[i].listed) continue;
        if (out) out[n] = &procs[i];
        n++;
    }
    return n;
}

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    DEVICE_OR_RETURN(handle);
    proc_t *found[MAX_PROCS];
    int n = procs_on(d, found, 0);
    if (infos == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        infos[i].pid = found[i]->pid;
        infos[i].usedGpuMemory = found[i]->used_mib * 1048576ULL;
        infos[i].gpuInstanceId = d->parent >= 0 ? d->gi : 0xFFFFFFFFu;
        infos[i].computeInstanceId = d->parent >= 0 ? d->ci : 0xFFFFFFFFu;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    return nvmlDeviceGetComputeRunningProcesses_v3(handle, count, infos);
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *handle, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *count, unsigned long long last_seen) {
    DEVICE_OR_RETURN(handle);
    spend(process_utilization_cost_us - call_cost_us);
    if (!d->proc_util) return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long now = now_us();
    proc_t *found[MAX_PROCS];
    int n = now > last_seen ? procs_on(d, found, 1) : 0;
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (utilization == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        utilization[i].pid = found[i]->pid;
        utilization[i].timeStamp = now;
        utilization[i].smUtil = (unsigned int)found[i]->sm;
        utilization[i].memUtil = found[i]->mem;
        utilization[i].encUtil = 0;
        utilization[i].decUtil = 0;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}
#endif

__attribute__((unused)) static int mig_children(const device_t *parent, device_t **out) {
    int n = 0;
    for (int i = 0; i < device_count; i++) {
        if (devices[i].parent >= 0 && &devices[devices[i].parent] == parent) {
            if (out) out[n] = &devices[i];
            n++;
        }
    }
    return n;
}

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetMigMode(void *handle, unsigned int *current, unsigned int *pending) {
    DEVICE_OR_RETURN(handle);
    spend(mig_mode_cost_us - call_cost_us);
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = mig_children(d, NULL) > 0 ? 1 : 0;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned int *count) {
    DEVICE_OR_RETURN(handle);
    *count = mig_children(d, NULL) > 0 ? 7 : 0;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned int index, void **mig) {
    DEVICE_OR_RETURN(handle);
    device_t *children[MAX_DEVICES];
    int n = mig_children(d, children);
    if (index >= (unsigned int)n) return NVML_ERROR_NOT_FOUND;
    *mig = children[index];
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *handle, unsigned int *is_mig) {
    DEVICE_OR_RETURN(handle);
    *is_mig = d->parent >= 0;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *handle, void **parent) {
    DEVICE_OR_RETURN(handle);
    if (d->parent < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &devices[d->parent];
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *handle, unsigned int *id) {
    DEVICE_OR_RETURN(handle);
    if (d->parent < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *handle, unsigned int *id) {
    DEVICE_OR_RETURN(handle);
    if (d->parent < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci;
    return NVML_SUCCESS;
}
#endif

#ifndef FAKENVML_MINIMAL
nvmlReturn_t nvmlDeviceGetAttributes_v2(void *handle, nvmlDeviceAttributes_t *attributes) {
    DEVICE_OR_RETURN(handle);
    memset(attributes, 0, sizeof *attributes);
    unsigned int slices = d->parent >= 0 ? d->slices : 7;
    attributes->gpuInstanceSliceCount = slices;
    attributes->computeInstanceSliceCount = slices;
    attributes->multiprocessorCount = 16 * slices;
    attributes->memorySizeMB = d->memory_total_mib;
    return NVML_SUCCESS;
}
#endif
