/*
 * QueueCoalescing.pml: a model of the offline queue's coalescing edits, replays and crashes:
 * Sources/OfflineQueue/Queue/QueueEntryLifecycle.swift (which entry is being sent, which is being
 * replaced, what a replay's end does to an entry that changed meanwhile), as
 * Sources/OfflineQueue/Queue/OfflineQueueEngine.swift follows it (`persist`, `runPass`,
 * `replay`), over the store's files and index (Sources/OfflineQueue/Storage/DiskQueueStore.swift:
 * a write is durable before the enqueue returns; a finished entry leaves the index at once and
 * its file later; an open keeps the newest revision of a coalescing key).
 *
 * One coalescing key. A user saves EDITS edits of it, one after the other (enqueues of one key
 * take turns), offline: each is stored, replacing the entry that holds the key in place unless
 * that entry is being sent, when it is stored beside it; a write may fail (a full disk, at most
 * WRITE_FAILURES times). A replay pass at a time sends the oldest entry (by sequence) that is not
 * being replaced; the server answers 2xx, or "later" (at most RETRIES times), or the network is
 * gone (at most OFFLINE times). The process may crash once at any moment (CRASHES): memory is
 * lost, files stay (a deletion not yet done stays undone), and the queue reopens from them.
 *
 * Each step is one atomic step (the queue's actor, the store's lock), and QueueEntryLifecycle's
 * decisions follow the Swift code. Tests/OfflineQueueTests/QueueCoalescingModelTests.swift
 * replays spin's random simulations through the Swift `QueueEntryLifecycle` and compares each
 * decision.
 *
 * Checked exhaustively (Scripts/spin.sh, in .ci/run):
 * - assertions: the server never applies an older edit after a newer one; once everything is
 *   sent, the server holds the newest acknowledged edit (or a newer one whose enqueue was cut by
 *   the crash): the newest acknowledged edit survives, across a crash; no entry is sent twice at
 *   once;
 * - valid end states; LTL `drained`: the queue ends empty.
 *
 * What it found: deletions are unlinks that a crash may undo until the folder is fsynced, and
 * an older edit's file coming back alone — after the newer edit was delivered and its file
 * deleted — was replayed last, leaving the server with the older edit. The store now deletes a
 * replaced edit's file before the index shows the new one, and makes every deletion durable
 * before an edit of a coalescing key is sent (`DiskQueueStore.makeDeletionsDurable`); without
 * either, spin finds the lost update within a few hundred thousand states. CI checks one crash
 * (about 2.4 million states); two crashes (-DCRASHES=2, tens of millions of states, minutes)
 * were checked by hand when the fix landed.
 */

#define EDITS           3
#define RETRIES         1
#define OFFLINE         1
#define WRITE_FAILURES  1
#ifndef CRASHES
#define CRASHES         1
#endif
#define N               (EDITS + 1)

/* In random simulations (-DSIM: the traces the Swift tests replay) the crash waits for some
   progress, or it would come first in most runs; the exhaustive search lets it come at any step. */
#ifdef SIM
byte progress = 0;
byte crashAfter;
#define PROGRESS   progress++
#define CRASH_GATE (progress >= crashAfter)
#else
#define PROGRESS   skip
#define CRASH_GATE true
#endif

/* Lifecycle phases (QueueEntryLifecycle.Phase). */
#define NONE      0
#define SENDING   1
#define REPLACING 2

/* Outcomes (QueueAttemptOutcome) and replay ends (QueueEntryLifecycle.ReplayEnd). */
#define DELIVERED 1
#define RETRY     2
#define OFFLINED  3
#define REMOVE    1
#define SUPERSEDE 2
#define KEEP      3
#define LEAVE     5

/* ---- durable: the folder ---- */
bool file[N];          /* entry i (made by edit i, revision i) has a file */
bool gone[N];          /* its file was deleted, but no directory fsync has made that durable yet */
bool dirty = false;    /* a deletion since the last directory fsync (DiskQueueStore's deletion ticks) */

/* ---- in memory: the store's index and the lifecycle ---- */
bool indexed[N];
byte queued = 0;       /* how many are indexed */
byte seq[N];
byte nextSeq = 1;
byte phase[N];

/* ---- the world ---- */
byte acked = 0;        /* the newest edit whose enqueue returned */
byte serverLast = 0;   /* the newest edit the server applied */
byte retriesLeft = RETRIES;
byte offlineLeft = OFFLINE;
byte writeFailuresLeft = WRITE_FAILURES;
byte crashesLeft = CRASHES;
bool crashed = false;
bool clientDone = false;
bool replayerDone = false;
byte life = 0;         /* how many times the process crashed; a process of an older life is gone */
byte hk;               /* holderOf's cursor */

/* A directory fsync: every deletion so far is durable. */
inline syncDirectory() {
    dirty = false;
    hk = 1;
    do
    :: hk < N -> gone[hk] = false; hk++
    :: else -> break
    od
}

/* unlink(2): the file is gone from the folder, durably only after the next directory fsync. */
inline unlink(k) {
    if
    :: file[k] -> file[k] = false; gone[k] = true; dirty = true
    :: else -> skip
    fi
}

/* The entry holding the key: the newest indexed (store.entry(coalescingKey:)). */
inline holderOf(h) {
    h = 0;
    hk = N - 1;
    do
    :: hk > 0 && indexed[hk] -> h = hk; break
    :: hk > 0 && !indexed[hk] -> hk--
    :: hk == 0 -> break
    od
}

proctype Client() {
    byte v = 1, h, replaced, s;
    bool ok;
    {
    do
    :: v <= EDITS ->
        atomic {
            /* persist: store.entry(coalescingKey:), then lifecycle.startReplacing(_:) */
            holderOf(h);
            replaced = 0;
            if
            :: h != 0 ->
                ok = (phase[h] == NONE);
                if
                :: ok -> phase[h] = REPLACING; replaced = h
                :: else -> skip
                fi;
                printf("TRACE startReplacing life=%d id=%d ok=%d\n", life, h, ok)
            :: else -> skip
            fi;
            if
            :: replaced != 0 -> s = seq[replaced]
            :: else -> s = nextSeq; nextSeq++
            fi
        };
        atomic {
            /* store.insert(_:limit:replacing:): the file is written and the directory synced;
               the predecessor's file is deleted (not synced); then the index takes the new entry
               in the predecessor's place */
            if
            :: writeFailuresLeft > 0 -> writeFailuresLeft--; ok = false
            :: true ->
                ok = true;
                file[v] = true;
                syncDirectory();
                if
                :: replaced != 0 -> unlink(replaced)
                :: else -> skip
                fi;
                indexed[v] = true; queued++;
                seq[v] = s;
                if
                :: replaced != 0 -> indexed[replaced] = false; queued--
                :: else -> skip
                fi
            fi
        };
        atomic {
            /* lifecycle.replacementEnded(_:) (deferred), and the enqueue returns */
            if
            :: replaced != 0 ->
                if
                :: phase[replaced] == REPLACING -> phase[replaced] = NONE
                :: else -> skip
                fi;
                printf("TRACE replacementEnded life=%d id=%d\n", life, replaced)
            :: else -> skip
            fi;
            if
            :: ok -> acked = v
            :: else -> skip
            fi;
            PROGRESS
        };
        v++
    :: else -> break
    od;
    clientDone = true
    } unless { life != 0 }
}

proctype Replayer(byte mine) {
    byte e, k, outcome, end, h, best, held;
    bool still;
    {
    do
    :: atomic {
        /* runPass, run when there is something to send (an enqueue or a timer starts a pass):
           the oldest entry by sequence; one being replaced is held back */
        queued > 0 || clientDone;
        e = 0; best = 255; k = 1;
        do
        :: k < N ->
            if
            :: indexed[k] && seq[k] < best -> best = seq[k]; e = k
            :: else -> skip
            fi;
            k++
        :: else -> break
        od;
        if
        :: e == 0 && clientDone -> replayerDone = true
        :: e == 0 && !clientDone -> skip
        :: e != 0 && phase[e] == REPLACING ->
            printf("TRACE heldBack life=%d id=%d\n", life, e); held = e; e = 0
        :: e != 0 && phase[e] != REPLACING ->
            assert(phase[e] == NONE);               /* never sent twice at once */
            phase[e] = SENDING;                     /* lifecycle.replayStarted(_:) */
            printf("TRACE replayStarted life=%d id=%d\n", life, e)
        fi
       };
        /* store.makeDeletionsDurable(): before an edit of a coalescing key is sent, every deletion
           so far reaches the disk; else a crash could bring an older edit's file back alone, after
           this one was delivered and deleted, and the older edit be sent last */
        if
        :: e != 0 -> atomic { if :: dirty -> syncDirectory() :: else -> skip fi }
        :: held != 0 -> phase[held] != REPLACING; held = 0   /* the next pass comes after the write */
        :: else -> skip
        fi;
        if
        :: replayerDone -> break
        :: else -> skip
        fi;
        if
        :: e != 0 ->
            atomic {
                /* the server's answer */
                if
                :: outcome = DELIVERED;
                    assert(e >= serverLast);        /* never an older edit after a newer one */
                    serverLast = e
                :: retriesLeft > 0 -> retriesLeft--; outcome = RETRY
                :: offlineLeft > 0 -> offlineLeft--; outcome = OFFLINED
                fi
            };
            atomic {
                /* lifecycle.replayEnded(_:_:stillQueued:supersededBy:maxAttempts:now:) */
                phase[e] = NONE;
                still = indexed[e];
                holderOf(h);
                if
                :: outcome == DELIVERED -> end = REMOVE
                :: outcome == RETRY && !still -> end = LEAVE
                :: outcome == RETRY && still && h != e -> end = SUPERSEDE
                :: outcome == RETRY && still && h == e -> end = KEEP
                :: outcome == OFFLINED && still && h != e -> end = SUPERSEDE
                :: outcome == OFFLINED && !(still && h != e) -> end = LEAVE
                fi;
                printf("TRACE replayEnded life=%d id=%d outcome=%d still=%d supersededBy=%d end=%d\n", life, e, outcome, still, h, end);
                PROGRESS;
                if
                :: (end == REMOVE || end == SUPERSEDE) && indexed[e] -> indexed[e] = false; queued--   /* out of the index at once */
                :: else -> skip
                fi
            };
            /* a finished entry's file goes on a pool thread, not synced (DeferredRemovals) */
            if
            :: end == REMOVE || end == SUPERSEDE -> unlink(e)
            :: else -> skip
            fi
        :: else -> skip
        fi
    od
    } unless { life != mine }
}

/* The process dies at any moment: memory is gone, the folder stays. The queue reopens from it
   (DiskQueueStore.open keeps the newest revision of the key and deletes the others) and drains. */
proctype Crash() {
    byte k, newest;
    do
    :: replayerDone && clientDone -> break   /* no more crashes */
    :: atomic {
        crashesLeft > 0 && !replayerDone && CRASH_GATE -> crashesLeft--;
        crashed = true;
        life++;
        printf("TRACE crash life=%d\n", life);
        /* A deletion not made durable may or may not have reached the disk; memory is gone. */
        dirty = false;
        k = 1;
        do
        :: k < N ->
            if
            :: gone[k] -> file[k] = true
            :: true -> skip
            fi;
            gone[k] = false;
            k++
        :: else -> break
        od;
        /* DiskQueueStore.open: the newest revision of the key stays; the others are deleted */
        newest = 0;
        k = 1;
        do
        :: k < N ->
            indexed[k] = false; phase[k] = NONE; queued = 0;
            if
            :: file[k] -> newest = k
            :: else -> skip
            fi;
            k++
        :: else -> break
        od;
        k = 1;
        do
        :: k < N ->
            if
            :: file[k] && k != newest -> unlink(k)
            :: else -> skip
            fi;
            k++
        :: else -> break
        od;
        if
        :: dirty -> syncDirectory()                 /* the removals are made durable at once */
        :: else -> skip
        fi;
        if
        :: newest != 0 -> indexed[newest] = true; queued = 1; seq[newest] = nextSeq; nextSeq++
        :: else -> skip
        fi;
        clientDone = true;      /* the user's next edit is a new story */
        replayerDone = false;
        run Replayer(life)
       }
    od
}

/* Once the queue has drained: the newest acknowledged edit reached the server. */
proctype Check() {
    byte k;
    atomic {
        replayerDone && clientDone ->
        k = 1;
        do
        :: k < N -> assert(!indexed[k]); k++
        :: else -> break
        od;
        assert(serverLast >= acked);
        printf("TRACE drained life=%d server=%d acked=%d\n", life, serverLast, acked)
    }
}

init {
    atomic {
#ifdef SIM
        if
        :: crashAfter = 1
        :: crashAfter = 2
        :: crashAfter = 3
        :: crashAfter = 4
        :: crashAfter = 5
        :: crashAfter = 6
        fi;
#endif
        run Client();
        run Replayer(0);
        run Crash();
        run Check()
    }
}

ltl drained { <> (replayerDone && clientDone) }
