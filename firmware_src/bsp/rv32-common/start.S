/* The bare-metal RISC-V start-up the qemu-rv32 and esp32p4 BSPs share, included by each one's
 * start.S after it defines TRAP_ALIGN (mtvec's alignment on that core): gp/sp/tp, the FPU on, a
 * trap handler for faults before main installs its own, .bss cleared, the stack painted, then main; main's return value
 * goes to the BSP's bsp_exit (never reached on a board that serves requests until it is reset). */
    .section .text.start, "ax"
    .global _start
_start:
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop
    la sp, __stack_top
    la tp, __tls_base
    li t0, 0x6000           /* mstatus.FS = dirty: enable the F extension */
    csrs mstatus, t0
    csrwi fcsr, 0
    la t0, trap_entry
    csrw mtvec, t0
    la t0, __bss_start
    la t1, __bss_end
1:  bgeu t0, t1, 2f
    sw zero, 0(t0)
    addi t0, t0, 4
    j 1b
2:  la t0, __stack_bottom   /* paint the stack (nothing is on it yet): bsp_margins finds its high-water mark */
    la t1, __stack_top
    li t2, 0x5354434b       /* STACK_PAINT in common.c */
5:  bgeu t0, t1, 6f
    sw t2, 0(t0)
    addi t0, t0, 4
    j 5b
6:  call main
    call bsp_exit           /* main's return value is the exit code */
3:  j 3b

    .balign TRAP_ALIGN
trap_entry:
    la sp, __stack_top
    csrr a0, mcause
    csrr a1, mepc
    csrr a2, mtval
    call bsp_trap           /* the BSP's: reports the trap; never returns */
4:  j 4b
