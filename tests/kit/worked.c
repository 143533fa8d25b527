#include "worked.h"

#include <math.h>

const cp_worked cp_worked_examples[CP_N_WORKED] = {
    {"positive read", 3, 2, 2, {2, 0}, {2, 0, 0, 2, 1.2f, 0.8f}, {10, 0, 0, 10, 6, 4}, NAN, {1, 1, 1},
     {8.638, 1.362}, {0.724, 0.043, 0.233}, 5e-4, 5e-4},
    {"structural mask", 3, 2, 2, {2, 0}, {2, 0, 0, 2, 1.2f, 0.8f}, {10, 0, 0, 10, 6, 4}, NAN, {0, 1, 1},
     {5.071, 4.929}, {0.0, 0.155, 0.845}, 5e-4, 5e-4},
    {"key collision", 2, 2, 1, {1, 0}, {1, 0, 1, 0}, {0, 100}, NAN, {1, 1}, {50}, {0.5, 0.5}, 1e-4, 1e-4},
    /* scale 0: every allowed key scores the same, whatever the query */
    {"uniform control", 3, 2, 1, {3, -1}, {1, 0, 0, 1, -5, 2}, {2, 8, 14}, 0.0f, {1, 1, 1}, {8},
     {1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-4, 1e-4},
    /* the memory-interface example, printed to 2 decimals (17.04) */
    {"memory read", 3, 2, 1, {1, 0}, {1, 0, 0, 1, -1, 0}, {10, 20, 40}, NAN, {1, 1, 1}, {17.04},
     {0.576, 0.284, 0.140}, 5e-4, 5e-3},
    {"two-key mixture", 2, 2, 2, {1, 0}, {1, 0, 0, 1}, {2, 0, 0, 4}, NAN, {1, 1}, {1.34, 1.32}, {0.67, 0.33},
     5e-3, 5e-3},
};
