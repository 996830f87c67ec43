//go:build !purego

#include "textflag.h"

// CLASSIFY adds the masks of the 16 bytes at off(R12) to the accumulators,
// shifted left by sh: digits to AX, commas to CX, spaces to R13, '0' to
// R11. X8 holds 0x50 in every byte (moves '0'–'9' to 0x80–0x89, the least
// signed bytes), X9 0x8A (so a digit is a byte less than it, signed),
// X10 ',', X11 ' ', X12 '0'.
#define CLASSIFY(off, sh) \
	MOVOU    off(R12), X0 \
	MOVO     X0, X1       \
	PADDB    X8, X1       \
	MOVO     X9, X2       \
	PCMPGTB  X1, X2       \
	PMOVMSKB X2, DX       \
	SHLQ     $sh, DX      \
	ORQ      DX, AX       \
	MOVO     X0, X1       \
	PCMPEQB  X10, X1      \
	PMOVMSKB X1, DX       \
	SHLQ     $sh, DX      \
	ORQ      DX, CX       \
	MOVO     X0, X1       \
	PCMPEQB  X11, X1      \
	PMOVMSKB X1, DX       \
	SHLQ     $sh, DX      \
	ORQ      DX, R13      \
	PCMPEQB  X12, X0      \
	PMOVMSKB X0, DX       \
	SHLQ     $sh, DX      \
	ORQ      DX, R11

// BROADCAST sets every byte of x to the byte b, through r.
#define BROADCAST(b, r, x) \
	MOVQ       $b, r \
	MOVQ       r, x  \
	PUNPCKLQDQ x, x

// func scanBlocks(p *byte, nb int, out *uint32) (done, k, begun int, stuck bool)
//
// Registers: R12 the block, BX blocks left, DI out, R8 ids written, R9
// where the id running into the block starts (0: none), R10 1 if the byte
// before the block is a comma; in a block DX holds the starts of ids and
// R11 their ends (the comma after each), R13 an id's start and CX its
// length; R14, R15, SI the digit conversion's masks; X13 the ids written
// before the block, X14 p.
TEXT ·scanBlocks(SB), NOSPLIT, $0-49
	MOVQ p+0(FP), R12
	MOVQ R12, X14
	MOVQ nb+8(FP), BX
	MOVQ out+16(FP), DI
	XORQ R8, R8
	XORQ R9, R9
	MOVQ $1, R10
	BROADCAST(0x5050505050505050, AX, X8)
	BROADCAST(0x8A8A8A8A8A8A8A8A, AX, X9)
	BROADCAST(0x2C2C2C2C2C2C2C2C, AX, X10)
	BROADCAST(0x2020202020202020, AX, X11)
	BROADCAST(0x3030303030303030, AX, X12)
	MOVQ $0x0F0F0F0F0F0F0F0F, R14
	MOVQ $0x00FF00FF00FF00FF, R15
	MOVQ $0x0000FFFF0000FFFF, SI
	TESTQ BX, BX
	JZ    done

block:
	MOVQ R8, X13
	XORQ AX, AX
	XORQ CX, CX
	XORQ R13, R13
	XORQ R11, R11
	CLASSIFY(0, 0)
	CLASSIFY(16, 16)
	CLASSIFY(32, 32)
	CLASSIFY(48, 48)

	// Every byte a digit, a comma or a space.
	MOVQ AX, DX
	ORQ  CX, DX
	ORQ  R13, DX
	NOTQ DX
	TESTQ DX, DX
	JNZ  stuck
	// A space only after a comma; then prevC for the next block.
	MOVQ CX, DX
	SHLQ $1, DX
	ORQ  R10, DX
	NOTQ DX
	ANDQ R13, DX
	JNZ  stuck
	MOVQ CX, R10
	SHRQ $63, R10
	// afterD in R13: the bytes after a digit.
	MOVQ  AX, R13
	SHLQ  $1, R13
	TESTQ R9, R9
	JZ    2(PC)
	ORQ   $1, R13
	// A comma only after a digit.
	MOVQ R13, DX
	NOTQ DX
	ANDQ CX, DX
	JNZ  stuck
	// starts = digit &^ afterD in DX; ends = comma & afterD in R13.
	MOVQ R13, DX
	NOTQ DX
	ANDQ AX, DX
	ANDQ CX, R13
	// No leading zero: a '0' that starts an id with a digit after it (one
	// at the block's last byte is checked as the next block's first id).
	SHRQ $1, AX
	ANDQ DX, AX
	ANDQ R11, AX
	JNZ  stuck
	MOVQ R13, R11

	// The id begun in the block before ends at the first comma.
	TESTQ R9, R9
	JZ    next
	MOVQ  R9, R13
	BSFQ  R11, CX
	JZ    stuck // runs through the block: over 64 digits
	ADDQ  R12, CX
	SUBQ  R13, CX
	CMPB  (R13), $0x30
	JNE   convert
	CMPQ  CX, $1
	JNE   stuck
	JMP   convert

id:
	BSFQ DX, R13
	ADDQ R12, R13
	LEAQ -1(DX), AX
	ANDQ AX, DX
	BSFQ R11, CX
	ADDQ R12, CX
	SUBQ R13, CX

convert:
	// The id's CX digits at R13 (1–8; more leaves the fast path): shifted
	// to the top of the word, then combined pairwise to 2, 4 and 8 digits
	// per lane.
	LEAQ  -1(R11), AX
	ANDQ  AX, R11
	CMPQ  CX, $8
	JA    stuck
	MOVQ  (R13), AX
	SHLQ  $3, CX
	NEGQ  CX
	SHLQ  CX, AX
	ANDQ  R14, AX
	IMULQ $2561, AX
	SHRQ  $8, AX
	ANDQ  R15, AX
	IMULQ $6553601, AX
	SHRQ  $16, AX
	ANDQ  SI, AX
	MOVQ  $0x0000271000000001, CX
	IMULQ CX, AX
	SHRQ  $32, AX
	MOVL  AX, (DI)(R8*4)
	INCQ  R8

next:
	TESTQ R11, R11
	JNZ   id

	// A start left over is the id running into the next block.
	XORQ  R9, R9
	TESTQ DX, DX
	JZ    3(PC)
	BSFQ  DX, R9
	ADDQ  R12, R9
	ADDQ  $64, R12
	DECQ  BX
	JNZ   block

done:
	MOVB $0, stuck+48(FP)
	JMP  ret

stuck:
	MOVQ X13, R8
	MOVB $1, stuck+48(FP)

ret:
	MOVQ  X14, AX
	MOVQ  R12, DX
	SUBQ  AX, DX
	SHRQ  $6, DX
	MOVQ  DX, done+24(FP)
	MOVQ  R8, k+32(FP)
	MOVQ  $-1, DX
	TESTQ R9, R9
	JZ    3(PC)
	MOVQ  R9, DX
	SUBQ  AX, DX
	MOVQ  DX, begun+40(FP)
	RET
