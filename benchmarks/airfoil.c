/*
 * Sequential C99 reference of OP2's Airfoil application (OP2-Common,
 * apps/c/airfoil/airfoil_plain/dp: airfoil.cpp with the kernels save_soln.h,
 * adt_calc.h, res_calc.h, bres_calc.h, update.h). Same arithmetic in the same
 * order as OP2's sequential backend, same constants (float literals assigned
 * to doubles, as in airfoil.cpp), same rms definition.
 *
 * Usage:   airfoil_c MESH_FILE ITERS [REPEATS]
 *
 *   MESH_FILE  OP2 ASCII mesh ("new_grid.dat" format, 0-based ids)
 *   ITERS      number of iterations; one iteration = save_soln, then
 *              2 x (adt_calc, res_calc, bres_calc, update)
 *   REPEATS    (default 1) run the ITERS iterations REPEATS times, each from
 *              the free-stream initial state; the rms history is printed for
 *              the first run only, the timings are those of the fastest run.
 *
 * Output (stdout):
 *   "%d %.15e\n"                    iteration and rms, every 100 iterations
 *   "TIME %.9e \n"                  seconds per iteration (fastest repeat)
 *   "KERNEL <name> %.9e\n"          total seconds of each kernel's loops in
 *                                   that repeat (save_soln adt_calc res_calc
 *                                   bres_calc update)
 *
 * Build:   gcc -O3 -o benchmarks/build/airfoil_c benchmarks/airfoil.c -lm
 *          (no -march=native / -ffast-math: results are compared digit by digit)
 */

#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* global constants, as in airfoil.cpp */
static double gam, gm1, cfl, eps, qinf[4];

/* ------------------------------------------------------------------ kernels */

static inline void save_soln(const double *q, double *qold) {
  for (int n = 0; n < 4; n++) qold[n] = q[n];
}

static inline void adt_calc(const double *x1, const double *x2, const double *x3,
                            const double *x4, const double *q, double *adt) {
  double dx, dy, ri, u, v, c;

  ri = 1.0f / q[0];
  u = ri * q[1];
  v = ri * q[2];
  c = sqrt(gam * gm1 * (ri * q[3] - 0.5f * (u * u + v * v)));

  dx = x2[0] - x1[0];
  dy = x2[1] - x1[1];
  *adt = fabs(u * dy - v * dx) + c * sqrt(dx * dx + dy * dy);

  dx = x3[0] - x2[0];
  dy = x3[1] - x2[1];
  *adt += fabs(u * dy - v * dx) + c * sqrt(dx * dx + dy * dy);

  dx = x4[0] - x3[0];
  dy = x4[1] - x3[1];
  *adt += fabs(u * dy - v * dx) + c * sqrt(dx * dx + dy * dy);

  dx = x1[0] - x4[0];
  dy = x1[1] - x4[1];
  *adt += fabs(u * dy - v * dx) + c * sqrt(dx * dx + dy * dy);

  *adt = (*adt) / cfl;
}

static inline void res_calc(const double *x1, const double *x2, const double *q1,
                            const double *q2, const double *adt1,
                            const double *adt2, double *res1, double *res2) {
  double dx, dy, mu, ri, p1, vol1, p2, vol2, f;

  dx = x1[0] - x2[0];
  dy = x1[1] - x2[1];

  ri = 1.0f / q1[0];
  p1 = gm1 * (q1[3] - 0.5f * ri * (q1[1] * q1[1] + q1[2] * q1[2]));
  vol1 = ri * (q1[1] * dy - q1[2] * dx);

  ri = 1.0f / q2[0];
  p2 = gm1 * (q2[3] - 0.5f * ri * (q2[1] * q2[1] + q2[2] * q2[2]));
  vol2 = ri * (q2[1] * dy - q2[2] * dx);

  mu = 0.5f * ((*adt1) + (*adt2)) * eps;

  f = 0.5f * (vol1 * q1[0] + vol2 * q2[0]) + mu * (q1[0] - q2[0]);
  res1[0] += f;
  res2[0] -= f;
  f = 0.5f * (vol1 * q1[1] + p1 * dy + vol2 * q2[1] + p2 * dy) + mu * (q1[1] - q2[1]);
  res1[1] += f;
  res2[1] -= f;
  f = 0.5f * (vol1 * q1[2] - p1 * dx + vol2 * q2[2] - p2 * dx) + mu * (q1[2] - q2[2]);
  res1[2] += f;
  res2[2] -= f;
  f = 0.5f * (vol1 * (q1[3] + p1) + vol2 * (q2[3] + p2)) + mu * (q1[3] - q2[3]);
  res1[3] += f;
  res2[3] -= f;
}

static inline void bres_calc(const double *x1, const double *x2, const double *q1,
                             const double *adt1, double *res1, const int *bound) {
  double dx, dy, mu, ri, p1, vol1, p2, vol2, f;

  dx = x1[0] - x2[0];
  dy = x1[1] - x2[1];

  ri = 1.0f / q1[0];
  p1 = gm1 * (q1[3] - 0.5f * ri * (q1[1] * q1[1] + q1[2] * q1[2]));

  if (*bound == 1) {
    res1[1] += +p1 * dy;
    res1[2] += -p1 * dx;
  } else {
    vol1 = ri * (q1[1] * dy - q1[2] * dx);

    ri = 1.0f / qinf[0];
    p2 = gm1 * (qinf[3] - 0.5f * ri * (qinf[1] * qinf[1] + qinf[2] * qinf[2]));
    vol2 = ri * (qinf[1] * dy - qinf[2] * dx);

    mu = (*adt1) * eps;

    f = 0.5f * (vol1 * q1[0] + vol2 * qinf[0]) + mu * (q1[0] - qinf[0]);
    res1[0] += f;
    f = 0.5f * (vol1 * q1[1] + p1 * dy + vol2 * qinf[1] + p2 * dy) + mu * (q1[1] - qinf[1]);
    res1[1] += f;
    f = 0.5f * (vol1 * q1[2] - p1 * dx + vol2 * qinf[2] - p2 * dx) + mu * (q1[2] - qinf[2]);
    res1[2] += f;
    f = 0.5f * (vol1 * (q1[3] + p1) + vol2 * (qinf[3] + p2)) + mu * (q1[3] - qinf[3]);
    res1[3] += f;
  }
}

static inline void update(const double *qold, double *q, double *res,
                          const double *adt, double *rms) {
  double del, adti;

  adti = 1.0f / (*adt);

  for (int n = 0; n < 4; n++) {
    del = adti * res[n];
    q[n] = qold[n] - del;
    res[n] = 0.0f;
    *rms += del * del;
  }
}

/* ------------------------------------------------------------------ helpers */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *path, const char *what) {
  fprintf(stderr, "airfoil_c: %s: %s\n", path, what);
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "airfoil_c: out of memory\n");
    exit(1);
  }
  return p;
}

/* ------------------------------------------------------------------ main */

enum { K_SAVE, K_ADT, K_RES, K_BRES, K_UPDATE, NKERNEL };
static const char *kernel_name[NKERNEL] = {"save_soln", "adt_calc", "res_calc",
                                           "bres_calc", "update"};

int main(int argc, char **argv) {
  int *becell, *ecell, *bound, *bedge, *edge, *cell;
  double *x, *q, *qold, *adt, *res;
  int nnode, ncell, nedge, nbedge, niter, nrepeat = 1;
  double rms;

  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s MESH_FILE ITERS [REPEATS]\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  niter = atoi(argv[2]);
  if (argc == 4) nrepeat = atoi(argv[3]);
  if (niter < 0 || nrepeat < 1) {
    fprintf(stderr, "airfoil_c: ITERS must be >= 0 and REPEATS >= 1\n");
    return 2;
  }

  /* read in grid (same fscanf formats as airfoil.cpp) */
  FILE *fp = fopen(path, "r");
  if (fp == NULL) die(path, "cannot open file");
  if (fscanf(fp, "%d %d %d %d \n", &nnode, &ncell, &nedge, &nbedge) != 4)
    die(path, "error reading header");
  if (nnode < 0 || ncell < 0 || nedge < 0 || nbedge < 0) die(path, "bad header");

  cell = (int *)xmalloc(4 * (size_t)ncell * sizeof(int));
  edge = (int *)xmalloc(2 * (size_t)nedge * sizeof(int));
  ecell = (int *)xmalloc(2 * (size_t)nedge * sizeof(int));
  bedge = (int *)xmalloc(2 * (size_t)nbedge * sizeof(int));
  becell = (int *)xmalloc((size_t)nbedge * sizeof(int));
  bound = (int *)xmalloc((size_t)nbedge * sizeof(int));

  x = (double *)xmalloc(2 * (size_t)nnode * sizeof(double));
  q = (double *)xmalloc(4 * (size_t)ncell * sizeof(double));
  qold = (double *)xmalloc(4 * (size_t)ncell * sizeof(double));
  res = (double *)xmalloc(4 * (size_t)ncell * sizeof(double));
  adt = (double *)xmalloc((size_t)ncell * sizeof(double));

  for (int n = 0; n < nnode; n++)
    if (fscanf(fp, "%lf %lf \n", &x[2 * n], &x[2 * n + 1]) != 2)
      die(path, "error reading node coordinates");
  for (int n = 0; n < ncell; n++)
    if (fscanf(fp, "%d %d %d %d \n", &cell[4 * n], &cell[4 * n + 1],
               &cell[4 * n + 2], &cell[4 * n + 3]) != 4)
      die(path, "error reading cells");
  for (int n = 0; n < nedge; n++)
    if (fscanf(fp, "%d %d %d %d \n", &edge[2 * n], &edge[2 * n + 1],
               &ecell[2 * n], &ecell[2 * n + 1]) != 4)
      die(path, "error reading edges");
  for (int n = 0; n < nbedge; n++)
    if (fscanf(fp, "%d %d %d %d \n", &bedge[2 * n], &bedge[2 * n + 1],
               &becell[n], &bound[n]) != 4)
      die(path, "error reading boundary edges");
  fclose(fp);

  for (int n = 0; n < 4 * ncell; n++)
    if (cell[n] < 0 || cell[n] >= nnode) die(path, "cell node id out of range");
  for (int n = 0; n < 2 * nedge; n++) {
    if (edge[n] < 0 || edge[n] >= nnode) die(path, "edge node id out of range");
    if (ecell[n] < 0 || ecell[n] >= ncell) die(path, "edge cell id out of range");
  }
  for (int n = 0; n < nbedge; n++) {
    if (bedge[2 * n] < 0 || bedge[2 * n] >= nnode || bedge[2 * n + 1] < 0 ||
        bedge[2 * n + 1] >= nnode)
      die(path, "boundary edge node id out of range");
    if (becell[n] < 0 || becell[n] >= ncell) die(path, "boundary edge cell id out of range");
  }

  /* set constants (float literals, exactly as airfoil.cpp) */
  gam = 1.4f;
  gm1 = gam - 1.0f;
  cfl = 0.9f;
  eps = 0.05f;

  double mach = 0.4f;
  double alpha = 3.0f * atan(1.0f) / 45.0f;
  double p = 1.0f;
  double r = 1.0f;
  double u = sqrt(gam * p / r) * mach;
  double e = p / (r * gm1) + 0.5f * u * u;
  (void)alpha;

  qinf[0] = r;
  qinf[1] = r * u;
  qinf[2] = 0.0f;
  qinf[3] = r * e;

  double best_time = -1.0;
  double best_kernel[NKERNEL] = {0};

  for (int rep = 0; rep < nrepeat; rep++) {
    double ktime[NKERNEL] = {0};

    for (int n = 0; n < ncell; n++) {
      for (int m = 0; m < 4; m++) {
        q[4 * n + m] = qinf[m];
        res[4 * n + m] = 0.0f;
      }
    }

    double t_start = now(), t0, t1;

    for (int iter = 1; iter <= niter; iter++) {
      /* save old flow solution */
      t0 = now();
      for (int n = 0; n < ncell; n++) save_soln(&q[4 * n], &qold[4 * n]);
      t1 = now();
      ktime[K_SAVE] += t1 - t0;

      /* predictor/corrector update loop */
      for (int k = 0; k < 2; k++) {
        /* calculate area/timestep */
        t0 = now();
        for (int n = 0; n < ncell; n++) {
          const int *c = &cell[4 * n];
          adt_calc(&x[2 * c[0]], &x[2 * c[1]], &x[2 * c[2]], &x[2 * c[3]],
                   &q[4 * n], &adt[n]);
        }
        t1 = now();
        ktime[K_ADT] += t1 - t0;

        /* calculate flux residual */
        t0 = t1;
        for (int n = 0; n < nedge; n++) {
          const int n1 = edge[2 * n], n2 = edge[2 * n + 1];
          const int c1 = ecell[2 * n], c2 = ecell[2 * n + 1];
          res_calc(&x[2 * n1], &x[2 * n2], &q[4 * c1], &q[4 * c2], &adt[c1],
                   &adt[c2], &res[4 * c1], &res[4 * c2]);
        }
        t1 = now();
        ktime[K_RES] += t1 - t0;

        t0 = t1;
        for (int n = 0; n < nbedge; n++) {
          const int n1 = bedge[2 * n], n2 = bedge[2 * n + 1];
          const int c1 = becell[n];
          bres_calc(&x[2 * n1], &x[2 * n2], &q[4 * c1], &adt[c1], &res[4 * c1],
                    &bound[n]);
        }
        t1 = now();
        ktime[K_BRES] += t1 - t0;

        /* update flow field */
        rms = 0.0;

        t0 = t1;
        for (int n = 0; n < ncell; n++)
          update(&qold[4 * n], &q[4 * n], &res[4 * n], &adt[n], &rms);
        t1 = now();
        ktime[K_UPDATE] += t1 - t0;
      }

      /* print iteration history */
      rms = sqrt(rms / (double)ncell);
      if (rep == 0 && iter % 100 == 0) printf("%d %.15e\n", iter, rms);
    }

    double elapsed = now() - t_start;
    if (best_time < 0.0 || elapsed < best_time) {
      best_time = elapsed;
      memcpy(best_kernel, ktime, sizeof(ktime));
    }
  }

  printf("TIME %.9e \n", niter > 0 ? best_time / niter : 0.0);
  for (int k = 0; k < NKERNEL; k++) printf("KERNEL %s %.9e\n", kernel_name[k], best_kernel[k]);

  free(cell);
  free(edge);
  free(ecell);
  free(bedge);
  free(becell);
  free(bound);
  free(x);
  free(q);
  free(qold);
  free(res);
  free(adt);
  return 0;
}
