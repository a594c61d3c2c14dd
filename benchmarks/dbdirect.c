/* The database directly: the benchmark's SQL run by a small C client, closed loop, as the gateways' floor.
 *
 *   dbdirect <config> mysql|postgres <host> <port> <user> <password> <database> <threads> <seconds> uniform|zipf
 *
 * <config> is written by benchmarks/workload.py (direct_config): the key space (`dims w:2 d:10 c:3000`) and one
 * line per query, `query <k> <names>\t<SQL with {name} holes>`. Each thread keeps one connection (libmariadb or
 * libpq, text protocol, autocommit), draws a user exactly as the Lua script does (uniform, or Zipf s=1.0 with
 * the hot ranks scattered by user = (rank * 1000003 + 12345) mod N), substitutes the integers into the SQL,
 * fetches every row and checks that the first k columns of the first row are the values asked for.
 * Prints one JSON line: calls, errors, failed checks, latency percentiles (µs).
 * Built by benchmarks/dbdirect.py with the system's client libraries (pkg-config libmariadb libpq).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mysql.h>
#include <libpq-fe.h>

#define MAXQ 16
#define MAXD 4
#define STRIDE 1000003ULL
#define OFFSET 12345ULL

typedef struct { int nseg; char *lit[64]; int var[64]; int k; int check[MAXD]; } query_t;

static int ndims; static char dim_name[MAXD][32]; static uint64_t dim_size[MAXD]; static uint64_t N;
static query_t queries[MAXQ]; static int nq;
static double *cdf; static int zipf;
static const char *kind, *host, *user, *password, *database; static int port;
static double deadline;

typedef struct { int id; uint64_t calls, errors, checked, bad; double *lat; size_t nlat, cap; char err[256]; } worker_t;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static uint64_t rng_next(uint64_t *s) { *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27; return *s * 2685821657736338717ULL; }
static double rng_unit(uint64_t *s) { return (rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static int dim_index(const char *name) {
    for (int i = 0; i < ndims; i++) if (!strcmp(dim_name[i], name)) return i;
    fprintf(stderr, "dbdirect: unknown key name %s\n", name); exit(2);
}

static void parse_query(char *line) {
    query_t *q = &queries[nq++];
    char *tab = strchr(line, '\t'); *tab = 0; char *sql = tab + 1;
    char names[256]; q->k = 0; names[0] = 0;
    sscanf(line, "query %d %255s", &q->k, names);
    char *save = NULL; int i = 0;
    for (char *t = strtok_r(names, ",", &save); t && i < q->k; t = strtok_r(NULL, ",", &save)) q->check[i++] = dim_index(t);
    q->nseg = 0; char *p = sql;
    while (*p) {
        char *open = strchr(p, '{');
        if (!open) { q->lit[q->nseg] = strdup(p); q->var[q->nseg++] = -1; break; }
        char *close = strchr(open, '}'); *open = 0; *close = 0;
        q->lit[q->nseg] = strdup(p); q->var[q->nseg++] = dim_index(open + 1);
        p = close + 1;
    }
}

static void draw(uint64_t *s, uint64_t *vals) {
    uint64_t rank;
    if (zipf) {
        double x = rng_unit(s) * cdf[N - 1]; uint64_t lo = 0, hi = N - 1;
        while (lo < hi) { uint64_t mid = (lo + hi) / 2; if (cdf[mid] < x) lo = mid + 1; else hi = mid; }
        rank = lo;
    } else rank = (uint64_t)(rng_unit(s) * N);
    uint64_t u = (rank * STRIDE + OFFSET) % N;
    for (int i = ndims - 1; i >= 0; i--) { vals[i] = u % dim_size[i] + 1; u /= dim_size[i]; }
}

static size_t render(query_t *q, uint64_t *vals, char *buf, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < q->nseg; i++) {
        n += snprintf(buf + n, cap - n, "%s", q->lit[i]);
        if (q->var[i] >= 0) n += snprintf(buf + n, cap - n, "%llu", (unsigned long long)vals[q->var[i]]);
    }
    return n;
}

static void record(worker_t *w, double us) {
    if (w->nlat == w->cap) { w->cap = w->cap ? w->cap * 2 : 65536; w->lat = realloc(w->lat, w->cap * sizeof(double)); }
    w->lat[w->nlat++] = us;
}

static int check_value(const char *got, uint64_t want) { return got && strtoull(got, NULL, 10) == want; }

static void *run(void *arg) {
    worker_t *w = arg; uint64_t s = 0x9E3779B97F4A7C15ULL * (w->id + 1); char sql[8192]; uint64_t vals[MAXD];
    MYSQL *my = NULL; PGconn *pg = NULL;
    if (!strcmp(kind, "mysql")) {
        my = mysql_init(NULL);
        if (!mysql_real_connect(my, host, user, password, database, port, NULL, 0)) {
            snprintf(w->err, sizeof w->err, "%s", mysql_error(my)); return NULL;
        }
    } else {
        char dsn[512]; snprintf(dsn, sizeof dsn, "host=%s port=%d user=%s password=%s dbname=%s", host, port, user, password, database);
        pg = PQconnectdb(dsn);
        if (PQstatus(pg) != CONNECTION_OK) { snprintf(w->err, sizeof w->err, "%s", PQerrorMessage(pg)); return NULL; }
    }
    while (now() < deadline) {
        query_t *q = &queries[rng_next(&s) % nq]; draw(&s, vals);
        size_t len = render(q, vals, sql, sizeof sql);
        double t0 = now(); int ok = 1, good = 1;
        if (my) {
            if (mysql_real_query(my, sql, len)) { ok = 0; snprintf(w->err, sizeof w->err, "%s", mysql_error(my)); }
            else {
                MYSQL_RES *res = mysql_store_result(my);
                MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
                if (q->k) { if (!row) good = 0; else for (int i = 0; i < q->k; i++) good &= check_value(row[i], vals[q->check[i]]); }
                if (res) mysql_free_result(res);
            }
        } else {
            PGresult *res = PQexec(pg, sql);
            ExecStatusType st = PQresultStatus(res);
            if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) { ok = 0; snprintf(w->err, sizeof w->err, "%s", PQresultErrorMessage(res)); }
            else if (q->k) {
                if (PQntuples(res) < 1) good = 0;
                else for (int i = 0; i < q->k; i++) good &= check_value(PQgetvalue(res, 0, i), vals[q->check[i]]);
            }
            PQclear(res);
        }
        double us = (now() - t0) * 1e6;
        w->calls++;
        if (!ok) { w->errors++; continue; }
        if (q->k) { w->checked++; if (!good) w->bad++; }
        record(w, us);
    }
    if (my) mysql_close(my);
    if (pg) PQfinish(pg);
    return NULL;
}

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
    if (argc != 11) { fprintf(stderr, "usage: dbdirect config kind host port user password database threads seconds dist\n"); return 2; }
    FILE *f = fopen(argv[1], "r"); if (!f) { perror(argv[1]); return 2; }
    kind = argv[2]; host = argv[3]; port = atoi(argv[4]); user = argv[5]; password = argv[6]; database = argv[7];
    int threads = atoi(argv[8]); double seconds = atof(argv[9]); zipf = !strcmp(argv[10], "zipf");
    char line[16384];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "dims ", 5)) {
            char *save = NULL;
            for (char *t = strtok_r(line + 5, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
                char *c = strchr(t, ':'); *c = 0; snprintf(dim_name[ndims], 32, "%s", t); dim_size[ndims++] = strtoull(c + 1, NULL, 10);
            }
        } else if (!strncmp(line, "query ", 6)) parse_query(line);
    }
    fclose(f);
    N = 1; for (int i = 0; i < ndims; i++) N *= dim_size[i];
    if (zipf) { cdf = malloc(N * sizeof(double)); double h = 0; for (uint64_t k = 0; k < N; k++) { h += 1.0 / (k + 1); cdf[k] = h; } }
    if (!strcmp(kind, "mysql")) mysql_library_init(0, NULL, NULL);
    worker_t *ws = calloc(threads, sizeof(worker_t)); pthread_t *ts = calloc(threads, sizeof(pthread_t));
    double start = now(); deadline = start + seconds;
    for (int i = 0; i < threads; i++) { ws[i].id = i; pthread_create(&ts[i], NULL, run, &ws[i]); }
    uint64_t calls = 0, errors = 0, checked = 0, bad = 0; size_t n = 0; const char *err = "";
    for (int i = 0; i < threads; i++) { pthread_join(ts[i], NULL); n += ws[i].nlat; }
    double elapsed = now() - start;
    double *all = malloc((n ? n : 1) * sizeof(double)); size_t at = 0; double sum = 0;
    for (int i = 0; i < threads; i++) {
        calls += ws[i].calls; errors += ws[i].errors; checked += ws[i].checked; bad += ws[i].bad;
        if (ws[i].err[0] && !err[0]) err = ws[i].err;
        memcpy(all + at, ws[i].lat, ws[i].nlat * sizeof(double)); at += ws[i].nlat;
    }
    qsort(all, n, sizeof(double), cmp);
    for (size_t i = 0; i < n; i++) sum += all[i];
#define PCT(p) (n ? all[(size_t)fmin(n - 1, ceil((p) / 100.0 * n) - 1)] : 0)
    char esc[600]; size_t e = 0;
    for (const char *c = err; *c && e < sizeof esc - 8; c++) { if (*c == '"' || *c == '\\') esc[e++] = '\\'; esc[e++] = (*c < 32) ? ' ' : *c; }
    esc[e] = 0;
    printf("QAGJSON {\"mode\":\"direct\",\"duration_us\":%.0f,\"requests\":%llu,\"responses\":%llu,\"non2xx\":%llu,"
           "\"checked\":%llu,\"bad\":%llu,\"unmatched\":0,\"error_sample\":\"%s\","
           "\"lat_us\":{\"mean\":%.1f,\"max\":%.0f,\"p50\":%.0f,\"p90\":%.0f,\"p99\":%.0f,\"p999\":%.0f}}\n",
           elapsed * 1e6, (unsigned long long)calls, (unsigned long long)calls, (unsigned long long)errors,
           (unsigned long long)checked, (unsigned long long)bad, esc, n ? sum / n : 0, n ? all[n - 1] : 0,
           PCT(50), PCT(90), PCT(99), PCT(99.9));
    return 0;
}
