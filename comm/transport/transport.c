/*
 * comm/transport/transport.c — the transport table (echo.h, "The transport table"):
 * one row per transport, behind one echo_world_create. A new transport is
 * its file (the echo_transport_ops of echo_internal.h), its constructor and
 * one row here.
 */
#include <stdio.h>
#include <string.h>

#include "comm/echo_internal.h"
#include "comm/transport/transport.h"

static int create_local(const echo_world_opts *o, const echo_config *cfg, echo_world **out, char *err,
                        size_t errlen) {
    if (o->device < 0) return echo_world_create_local(o->nranks, cfg, out, err, errlen);
    return echo_world_create_local_device(o->nranks, o->device, cfg, out, err, errlen);
}

static int create_nccl(const echo_world_opts *o, const echo_config *cfg, echo_world **out, char *err,
                       size_t errlen) {
    if (o->procs) return echo_world_create_nccl_procs(o->device, cfg, out, err, errlen);
    if (!o->devices) {
        snprintf(err, errlen, "echo: the nccl transport needs each rank's GPU (echo_world_opts.devices)");
        return -1;
    }
    return echo_world_create_nccl(o->nranks, o->devices, cfg, out, err, errlen);
}

static int create_mpi(const echo_world_opts *o, const echo_config *cfg, echo_world **out, char *err,
                      size_t errlen) {
    (void)o;
    return echo_world_create_mpi(cfg, out, err, errlen);
}

static const echo_transport_info transports[] = {
    {"local", 2, 0, 1, 0, 1, create_local},
    {"nccl", 1, 1, 1, 1, 0, create_nccl},
    {"mpi", 0, 0, 0, 1, 0, create_mpi},
};
#define N_TRANSPORTS ((int)(sizeof transports / sizeof *transports))

const echo_transport_info *echo_transport_at(int i) {
    return i >= 0 && i < N_TRANSPORTS ? &transports[i] : NULL;
}

const echo_transport_info *echo_transport_find(const char *name) {
    for (int i = 0; name && i < N_TRANSPORTS; i++)
        if (!strcmp(transports[i].name, name)) return &transports[i];
    return NULL;
}

static const char *transport_row(int i) {
    return i < N_TRANSPORTS ? transports[i].name : NULL;
}

const char *echo_transport_names(char *buf, size_t len, const char *sep) {
    return echo_names_join(buf, len, sep, transport_row);
}

int echo_world_create(const char *name, const echo_world_opts *o, const echo_config *cfg, echo_world **out,
                      char *err, size_t errlen) {
    *out = NULL;
    const echo_transport_info *t = echo_transport_find(name);
    if (!t) {
        char names[ECHO_MAX_TRANSPORTS * 16];
        snprintf(err, errlen, "echo: unknown transport '%s' (%s)", name ? name : "(null)",
                 echo_transport_names(names, sizeof names, ", "));
        return -1;
    }
    return t->create(o, cfg, out, err, errlen);
}
