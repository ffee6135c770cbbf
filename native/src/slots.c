/* The kernels' argument slots: the tables native/gen_slots.py writes from
 * kernels/variants.toml, and the lookups over them. */
#include <pthread.h>
#include <string.h>

#include "slots.h"

#include "aotr_slots_tables.h"

/* Name -> slot through an open-addressing table (a runtime start binds
 * tens of thousands of argument names: a linear search showed). */
#define NAME_TABLE 256
_Static_assert(NAME_TABLE >= 2 * AOTR_ARG_SLOTS, "NAME_TABLE is too small");
static int16_t name_table[NAME_TABLE];
static pthread_once_t name_table_once = PTHREAD_ONCE_INIT;

static void fill_name_table(void)
{
    for (int i = 0; i < NAME_TABLE; i++)
        name_table[i] = -1;
    for (int slot = 0; slot < AOTR_ARG_SLOTS; slot++) {
        uint32_t h = aotr_str_hash(slot_names[slot]) % NAME_TABLE;
        while (name_table[h] >= 0)
            h = (h + 1) % NAME_TABLE;
        name_table[h] = (int16_t)slot;
    }
}

int aotr_arg_slot(const char *name)
{
    pthread_once(&name_table_once, fill_name_table);
    uint32_t h = aotr_str_hash(name) % NAME_TABLE;
    for (; name_table[h] >= 0; h = (h + 1) % NAME_TABLE)
        if (strcmp(name, slot_names[name_table[h]]) == 0)
            return name_table[h];
    return -1;
}

const char *aotr_arg_slot_name(int slot)
{
    return slot >= 0 && slot < AOTR_ARG_SLOTS ? slot_names[slot] : "?";
}

aotr_arg_kind aotr_arg_slot_kind(int slot) { return slot_kinds[slot]; }

const int *aotr_kernel_required_slots(int kernel_id)
{
    static const int none[] = {-1};
    return kernel_id >= 0 && kernel_id < AOTR_KERNEL_COUNT ? required_slots[kernel_id] : none;
}
