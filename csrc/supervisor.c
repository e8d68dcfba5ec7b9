/*
 * supervisor.c: the containment supervisor program (placeholder; the real
 * one lands with the reusable-supervisor work).  Built as the executable
 * boundedproc/_bp_supervisor next to the extension module.
 */
#include "bp_internal.h"

int main(void)
{
    return 0;
}
