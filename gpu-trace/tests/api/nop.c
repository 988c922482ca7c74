/* A library with nothing in it (tests/api/late_dlopen.c loads it). */
int gt_nop(void) { return 7; }
