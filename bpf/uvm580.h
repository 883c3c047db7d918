// SPDX-License-Identifier: GPL-2.0
// The nvidia_uvm 580 types the fault-path programs read (bpf/uvmfault.bpf.c, bpf/fastpath.bpf.c):
// only the members used, under the driver's names; CO-RE fills the offsets at load time.
#ifndef UMCTL_UVM580_H
#define UMCTL_UVM580_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;
typedef long long s64;

struct task_struct { int tgid; } __attribute__((preserve_access_index));
struct mm_struct { struct task_struct *owner; } __attribute__((preserve_access_index));

struct uvm_va_space_mm_struct { struct mm_struct *mm; } __attribute__((preserve_access_index));
struct uvm_va_space_struct { struct uvm_va_space_mm_struct va_space_mm; } __attribute__((preserve_access_index));

struct uvm_parent_gpu_struct { struct { u32 val; } id; } __attribute__((preserve_access_index));
struct uvm_gpu_struct { struct { u32 val; } id; } __attribute__((preserve_access_index));

// anonymous enums, as in the driver: CO-RE matches a bitfield's enum type by name, and an
// anonymous enum is compatible with any enum of the same kind
typedef enum { UMCTL_FAULT_TYPE_ANY = 0 } uvm_fault_type_t;
typedef enum { UMCTL_FAULT_ACCESS_ANY = 0 } uvm_fault_access_type_t;

struct uvm_fault_buffer_entry_struct {
    u64 fault_address;
    u64 timestamp;
    uvm_fault_type_t fault_type: 6;
    uvm_fault_access_type_t fault_access_type: 4;
    struct uvm_va_space_struct *va_space;
} __attribute__((preserve_access_index));

struct uvm_fault_service_batch_context_struct {
    struct uvm_fault_buffer_entry_struct *fault_cache;
    u32 num_cached_faults;
    u32 num_coalesced_faults;
    u32 batch_id;
} __attribute__((preserve_access_index));

struct uvm_va_range_struct { struct uvm_va_space_struct *va_space; } __attribute__((preserve_access_index));
struct uvm_va_range_managed_struct { struct uvm_va_range_struct va_range; } __attribute__((preserve_access_index));

struct uvm_va_block_struct {
    struct uvm_va_range_managed_struct *managed_range;
    u64 start;
    u64 end;
} __attribute__((preserve_access_index));

#endif
