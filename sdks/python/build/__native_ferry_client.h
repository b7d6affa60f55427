#ifndef MYPYC_NATIVE_ferry_client_H
#define MYPYC_NATIVE_ferry_client_H
#include <Python.h>
#include <CPy.h>
#include "bytearray_extra_ops.h"
#ifndef MYPYC_DECLARED_tuple_T3OOO
#define MYPYC_DECLARED_tuple_T3OOO
typedef struct tuple_T3OOO {
    PyObject *f0;
    PyObject *f1;
    PyObject *f2;
} tuple_T3OOO;
#endif

#ifndef MYPYC_DECLARED_tuple_T2OO
#define MYPYC_DECLARED_tuple_T2OO
typedef struct tuple_T2OO {
    PyObject *f0;
    PyObject *f1;
} tuple_T2OO;
#endif

#ifndef MYPYC_DECLARED_tuple_T4IOIO
#define MYPYC_DECLARED_tuple_T4IOIO
typedef struct tuple_T4IOIO {
    CPyTagged f0;
    PyObject *f1;
    CPyTagged f2;
    PyObject *f3;
} tuple_T4IOIO;
#endif

#ifndef MYPYC_DECLARED_tuple_T3IIO
#define MYPYC_DECLARED_tuple_T3IIO
typedef struct tuple_T3IIO {
    CPyTagged f0;
    CPyTagged f1;
    PyObject *f2;
} tuple_T3IIO;
#endif

#ifndef MYPYC_DECLARED_tuple_T4OOOO
#define MYPYC_DECLARED_tuple_T4OOOO
typedef struct tuple_T4OOOO {
    PyObject *f0;
    PyObject *f1;
    PyObject *f2;
    PyObject *f3;
} tuple_T4OOOO;
#endif

#ifndef MYPYC_DECLARED_tuple_T2OI
#define MYPYC_DECLARED_tuple_T2OI
typedef struct tuple_T2OI {
    PyObject *f0;
    CPyTagged f1;
} tuple_T2OI;
#endif

#ifndef MYPYC_DECLARED_tuple_T4IIOI
#define MYPYC_DECLARED_tuple_T4IIOI
typedef struct tuple_T4IIOI {
    CPyTagged f0;
    CPyTagged f1;
    PyObject *f2;
    CPyTagged f3;
} tuple_T4IIOI;
#endif

#ifndef MYPYC_DECLARED_tuple_T2IO
#define MYPYC_DECLARED_tuple_T2IO
typedef struct tuple_T2IO {
    CPyTagged f0;
    PyObject *f1;
} tuple_T2IO;
#endif

#ifndef MYPYC_DECLARED_tuple_T5OOOOO
#define MYPYC_DECLARED_tuple_T5OOOOO
typedef struct tuple_T5OOOOO {
    PyObject *f0;
    PyObject *f1;
    PyObject *f2;
    PyObject *f3;
    PyObject *f4;
} tuple_T5OOOOO;
#endif

#ifndef MYPYC_DECLARED_tuple_T4OOII
#define MYPYC_DECLARED_tuple_T4OOII
typedef struct tuple_T4OOII {
    PyObject *f0;
    PyObject *f1;
    CPyTagged f2;
    CPyTagged f3;
} tuple_T4OOII;
#endif

#ifndef MYPYC_DECLARED_tuple_T4IIII
#define MYPYC_DECLARED_tuple_T4IIII
typedef struct tuple_T4IIII {
    CPyTagged f0;
    CPyTagged f1;
    CPyTagged f2;
    CPyTagged f3;
} tuple_T4IIII;
#endif

#ifndef MYPYC_DECLARED_tuple_T4OOCC
#define MYPYC_DECLARED_tuple_T4OOCC
typedef struct tuple_T4OOCC {
    PyObject *f0;
    PyObject *f1;
    char f2;
    char f3;
} tuple_T4OOCC;
#endif

#ifndef MYPYC_DECLARED_tuple_T3OOI
#define MYPYC_DECLARED_tuple_T3OOI
typedef struct tuple_T3OOI {
    PyObject *f0;
    PyObject *f1;
    CPyTagged f2;
} tuple_T3OOI;
#endif

#ifndef MYPYC_DECLARED_tuple_T6OOOOOO
#define MYPYC_DECLARED_tuple_T6OOOOOO
typedef struct tuple_T6OOOOOO {
    PyObject *f0;
    PyObject *f1;
    PyObject *f2;
    PyObject *f3;
    PyObject *f4;
    PyObject *f5;
} tuple_T6OOOOOO;
#endif

#ifndef MYPYC_DECLARED_tuple_T4CIOO
#define MYPYC_DECLARED_tuple_T4CIOO
typedef struct tuple_T4CIOO {
    char f0;
    CPyTagged f1;
    PyObject *f2;
    PyObject *f3;
} tuple_T4CIOO;
#endif

#ifndef MYPYC_DECLARED_tuple_T2IC
#define MYPYC_DECLARED_tuple_T2IC
typedef struct tuple_T2IC {
    CPyTagged f0;
    char f1;
} tuple_T2IC;
#endif

#ifndef MYPYC_DECLARED_tuple_T2II
#define MYPYC_DECLARED_tuple_T2II
typedef struct tuple_T2II {
    CPyTagged f0;
    CPyTagged f1;
} tuple_T2II;
#endif

#ifndef MYPYC_DECLARED_tuple_T1I
#define MYPYC_DECLARED_tuple_T1I
typedef struct tuple_T1I {
    CPyTagged f0;
} tuple_T1I;
#endif

#ifndef MYPYC_DECLARED_tuple_T3OII
#define MYPYC_DECLARED_tuple_T3OII
typedef struct tuple_T3OII {
    PyObject *f0;
    CPyTagged f1;
    CPyTagged f2;
} tuple_T3OII;
#endif

#ifndef MYPYC_DECLARED_tuple_T3CIO
#define MYPYC_DECLARED_tuple_T3CIO
typedef struct tuple_T3CIO {
    char f0;
    CPyTagged f1;
    PyObject *f2;
} tuple_T3CIO;
#endif

#ifndef MYPYC_DECLARED_tuple_T0
#define MYPYC_DECLARED_tuple_T0
typedef struct tuple_T0 {
    int empty_struct_error_flag;
} tuple_T0;
#endif

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *__sock;
    PyObject *__session;
    double _timeout;
    PyObject *__send_lock;
    PyObject *__lock;
    PyObject *__cond;
    PyObject *__dead;
    PyObject *__scratch;
    PyObject *__scratch_view;
    PyObject *__poll;
    double __spin;
} ferry_client____connection___ConnectionObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    vectorcallfunc vectorcall;
} ferry_client____connection_____mypyc_lambda__0_objObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_before;
    PyObject *_parts;
    PyObject *_fds;
    PyObject *_segments;
    PyObject *_keep;
} ferry_client____outgoing___OutgoingObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    CPyTagged _key;
    PyObject *_ref;
    CPyTagged _holder;
    PyObject *_shape;
    PyObject *_strides;
    PyObject *_dtype;
    PyObject *_wire;
    PyObject *_slot;
    CPyTagged _start;
    CPyTagged _span;
    PyObject *_head;
    PyObject *_tail;
} ferry_client____outgoing____SentObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_session;
    CPyTagged __next_id;
} ferry_client____rpc___RpcSessionObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
} ferry_client____rpc____SlowObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
} ferry_client____rpc____UnsendableObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_limits;
    PyObject *_reader;
    PyObject *_domain;
    PyObject *_token;
    PyObject *_agent;
    CPyTagged _pool_limit;
    CPyTagged _max_peer_bytes;
    PyObject *_channel;
    PyObject *_welcome;
    PyObject *_peer_limits;
    PyObject *_receiver;
    PyObject *_pool;
    PyObject *_offered;
    PyObject *_cuda_driver;
    PyObject *_cuda_domain;
    PyObject *_cuda;
    PyObject *_cuda_unavailable;
    CPyTagged _cuda_pool_limit;
    CPyTagged _cuda_max_peer_allocs;
    char _compact;
    char _shm_forget;
    PyObject *__sent;
} ferry_client____session___SessionObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_segment;
    CPyTagged _lease;
    CPyTagged _start;
    CPyTagged _length;
    PyObject *__done;
    PyObject *___array_interface__;
} ferry_client____shm___PeerViewObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    CPyTagged _max_peer_bytes;
    PyObject *_segments;
    CPyTagged _mapped;
    PyObject *_held;
    PyObject *_done;
} ferry_client____shm___ShmReceiverObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_segment;
    CPyTagged _offset;
    CPyTagged _size;
    CPyTagged _refs;
    PyObject *_ro;
} ferry_client____shm___SlotObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_pool;
    PyObject *_slot;
    PyObject *__dropped;
    PyObject *___array_interface__;
    PyObject *_ro;
} ferry_client____shm___OwnViewObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_mm;
    CPyTagged _id;
    CPyTagged _size;
    CPyTagged _fd;
    char _announced;
    PyObject *_bytes;
    CPyTagged _address;
} ferry_client____shm___SegmentObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    CPyTagged _pool_limit;
    CPyTagged _segment_bytes;
    PyObject *_segments;
    CPyTagged _reserved;
    PyObject *_granted;
    CPyTagged _next_lease;
    PyObject *_dropped;
    PyObject *_lock;
} ferry_client____shm___ShmPoolObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    CPyTagged _max_header_bytes;
    CPyTagged _max_payload_bytes;
    CPyTagged _max_tensors;
    CPyTagged _max_fds;
} ferry_client____wire___LimitsObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    CPyTagged _kind;
    PyObject *_header;
    PyObject *_payload;
    PyObject *_fds;
    CPyTagged _refs;
} ferry_client____wire___FrameObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_limits;
    PyObject *__buf;
    PyObject *__fds;
    char __preamble;
    PyObject *__prefix;
    PyObject *__header;
    char __have_header;
    CPyTagged __refs;
    PyObject *__payload;
    CPyTagged __got;
} ferry_client____wire___FrameReaderObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *__sock;
    PyObject *__session;
    double _timeout;
    PyObject *__send_lock;
    PyObject *__lock;
    PyObject *__cond;
    PyObject *__dead;
    PyObject *__scratch;
    PyObject *__scratch_view;
    PyObject *__poll;
    double __spin;
    PyObject *__rpc;
    CPyTagged __waiting;
    char __reading;
    PyObject *__pending;
    PyObject *__results;
} ferry_client___client___ClientObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *___mypyc_self__;
    PyObject *_self;
    PyObject *_method;
    PyObject *_params;
} ferry_client___client___notify_Client_envObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    vectorcallfunc vectorcall;
    PyObject *___mypyc_env__;
} ferry_client___client_____mypyc_lambda__0_notify_Client_objObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    uint32_t bitmap;
    PyObject *___mypyc_self__;
    PyObject *_self;
    PyObject *_calls;
    PyObject *_ids;
    PyObject *_timeout;
    double _deadline;
    PyObject *__;
} ferry_client___client___batch_Client_envObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    vectorcallfunc vectorcall;
    PyObject *___mypyc_env__;
} ferry_client___client_____mypyc_lambda__1_batch_Client_objObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *__sock;
    PyObject *__session;
    double _timeout;
    PyObject *__send_lock;
    PyObject *__lock;
    PyObject *__cond;
    PyObject *__dead;
    PyObject *__scratch;
    PyObject *__scratch_view;
    PyObject *__poll;
    double __spin;
    PyObject *__recv_lock;
} ferry_client___pipe___PipeObject;

typedef struct {
    PyObject_HEAD
    CPyVTableItem *vtable;
    PyObject *_array;
    PyObject *_dtype;
} ferry_client___tensors___TensorObject;

#endif
