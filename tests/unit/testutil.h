/*
 * Shared helpers for the Check suites. Tests run from the repository root
 * (make test does that), so fixture paths are relative to it.
 */
#ifndef ECHO_TESTUTIL_H
#define ECHO_TESTUTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define TU_FIXTURES "tests/fixtures"

/* Read a whole file; returns malloc'ed buffer (NUL-terminated) or NULL. */
char *tu_read_file(const char *path, size_t *len);
/* Write a whole file; 0 on success. */
int tu_write_file(const char *path, const void *data, size_t len);
/* A fresh private temporary directory (mkdtemp); caller frees the string
 * and may remove the tree with tu_rmtree(). */
char *tu_mkdtemp(void);
void tu_rmtree(const char *dir);
/* Run a shell command, capture stdout (malloc'ed) and the exit status. */
char *tu_run(const char *cmd, int *status);
/* A JSONL file as an array of its lines' values (blank lines skipped);
 * NULL when the file cannot be read or a line is not JSON (the reason on
 * stderr). */
json_t *tu_load_jsonl(const char *path);
/* ‖a − b‖₂ / ‖b‖₂ in double precision. */
double tu_rel_err(const float *a, const float *b, size_t n);

#endif
