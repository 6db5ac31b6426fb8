/*
 * engine/: the processes of rank > 0 under mpirun (engine.h, eng_follow):
 * they serve rank 0's engines, each made from the config eng_create sends
 * (OP_CREATE), stepping as rank 0 says (OP_STEP, proc.c), until OP_EXIT
 * (eng_procs_exit on rank 0) or a failed message.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/internal.h"

int eng_follow(char *err, size_t errlen) {
    eng *e = NULL;
    char *strs = NULL; /* the config's strings: outlive the engine made from it (e->cfg points into them) */
    for (;;) {
        ctl_hdr h;
        if (echo_proc_bcast(&h, sizeof h, err, errlen)) break;
        if (h.op == OP_CREATE) {
            eng_config c;
            char *next = NULL;
            int rc = eng_priv_cfg_bcast(&c, &next, err, errlen);
            if (rc < 0) break;
            if (rc > 0) continue; /* rank 0 makes none */
            eng_destroy(e);
            e = NULL;
            free(strs);
            strs = next;
            char cerr[1024];
            eng_priv_create(&c, 1, &e, cerr, sizeof cerr); /* a failure fails rank 0 alike, which reports it */
        } else if (h.op == OP_STEP) {
            if (!e) {
                snprintf(err, errlen, "rank %d: a step without an engine", echo_proc_rank());
                break;
            }
            if (eng_priv_follow_step(e, &h, err, errlen)) break;
        } else if (h.op == OP_DESTROY) {
            eng_destroy(e);
            e = NULL;
        } else if (h.op == OP_EXIT) {
            eng_destroy(e);
            free(strs);
            return 0;
        } else {
            snprintf(err, errlen, "rank %d: unknown control message %d", echo_proc_rank(), h.op);
            break;
        }
    }
    if (e) e->procs = 0; /* rank 0 is gone or confused: do not talk to it */
    eng_destroy(e);
    free(strs);
    return -1;
}

void eng_procs_exit(void) {
    if (echo_proc_count() < 2 || echo_proc_rank() != 0) return;
    ctl_hdr h = {.op = OP_EXIT};
    char err[256];
    echo_proc_bcast(&h, sizeof h, err, sizeof err);
}
