/*
 * SharedCall.pml: a model of Sources/RequestEngine/SharedCall+StateMachine.swift (with the
 * WaiterList of Sources/ResilienceCore/WaiterList.swift it keeps), the life of one shared call:
 * callers joining, suspending, being cancelled before or after they suspend; the call's task,
 * whose handle is reported late; attempts claimed by their task or by the watchdog's timeout,
 * which hands the rest to a successor task; the outcome.
 *
 * Each transition is one atomic step (SharedCall runs them under its lock) and follows the Swift
 * code; the answers a transition hands out are sent to the callers outside it, as SharedCall
 * resumes continuations outside its lock. Tests/RequestEngineTests/SharedCallModelTests.swift
 * replays spin's random simulations (`spin -n<seed>`) through the Swift machine and compares
 * every decision and every answer.
 *
 * The world: NW callers (caller 0 made the call; the others join it, or find it over and start
 * their own, which is not modelled); the first task, reported at any moment; up to ATTEMPTS
 * attempts, each answered or timed out (at most TIMEOUTS times, at any moment); up to CANCELS
 * cancellations of callers, at any moment.
 *
 * Checked exhaustively (Scripts/spin.sh, in .ci/run):
 * - assertions: every caller is answered exactly once; a caller that left before the outcome
 *   gets `cancelled`; the task is cancelled only when every caller has left; an attempt is
 *   claimed by its task or by the timeout, never both; nobody joins a call that is over;
 * - valid end states: no caller is left suspended;
 * - LTL `answered`: every caller ends.
 */

#ifndef NW
#define NW        3
#endif
#define ATTEMPTS  2
#define TIMEOUTS  1
#define CANCELS   2

/* Outcomes. */
#define SUCCESS   1
#define CANCELLED 2
#define TIMEDOUT  3

/* Ticket slots (WaiterList.Entry.slot). */
#define NONE      0
#define PENDING   1
#define WAITING   2
#define HANDED    3
#define LEFT      4

/* Phases. */
#define RUNNING   1
#define ABANDONED 2
#define COMPLETED 3

/* ---- the machine's state ---- */
byte phase = RUNNING;
byte outcome = 0;        /* once completed */
byte task = 0;           /* the task carrying the request: 0 none, 1 the first, 2 a successor */
bool handedOver = false;
byte waitingCount = 1;   /* callers that have not left */
bool open = false;       /* an attempt is open */
byte openAttempt;
byte slot[NW];           /* each caller's ticket */
byte handed[NW];         /* the value handed to a pending ticket */

/* ---- the world ---- */
chan answer[NW] = [1] of { byte };
byte cancelsLeft = CANCELS;
byte timeoutsLeft = TIMEOUTS;
bool cancelledTask[3];   /* a task was cancelled (by id) */
byte finished = 0;
byte joined = 1;         /* callers holding a ticket */
byte cw;                 /* complete()'s cursor */
int  delivered;          /* a completion's callers, as bits */

/* ---- ghosts, for the checks ---- */
byte answers[NW];
bool leftBeforeOutcome[NW];
byte claimedBy[ATTEMPTS];  /* 0: nobody, 1: its task, 2: the timeout */
byte leftCount = 0;

inline deliver(c, v) {
    answers[c]++;
    assert(answers[c] == 1);                       /* answered exactly once */
    /* a caller cancelled before the outcome gets `cancelled`, or the outcome already known as
       it suspends: never a later one */
    assert(!leftBeforeOutcome[c] || v == CANCELLED || phase == COMPLETED);
    answer[c]!v
}

/* complete(_:) */
inline complete(v) {
    if
    :: phase == COMPLETED -> delivered = -1        /* nil: already delivered */
    :: else ->
        phase = COMPLETED;
        outcome = v;
        task = 0;
        open = false;
        /* takeAll(): every suspended waiter */
        delivered = 0;
        cw = 0;
        do
        :: cw < NW ->
            if
            :: slot[cw] == WAITING -> slot[cw] = LEFT; delivered = delivered | (1 << cw); deliver(cw, v)
            :: else -> skip
            fi;
            cw++
        :: else -> break
        od
    fi;
    printf("TRACE complete outcome=%d delivered=%d\n", v, delivered)
}

/* leave(_:), for caller c: its cancellation, while it is pending or suspended. */
inline leave(c) {
    cancel = 0;
    answeredNow = 0;
    if
    :: phase == RUNNING ->
        leftBeforeOutcome[c] = true;
        /* WaiterList.cancel(_:with: .cancelled) */
        if
        :: slot[c] == PENDING -> slot[c] = HANDED; handed[c] = CANCELLED
        :: slot[c] == WAITING -> slot[c] = LEFT; answeredNow = 1; deliver(c, CANCELLED)
        :: else -> skip
        fi;
        waitingCount--;
        leftCount++;
        if
        :: waitingCount == 0 ->
            assert(leftCount == joined);          /* the task is cancelled only when all left */
            phase = ABANDONED;
            cancel = task;
            if
            :: task != 0 -> cancelledTask[task] = true
            :: else -> skip
            fi
        :: else -> skip
        fi
    :: else -> skip
    fi;
    printf("TRACE leave c=%d answered=%d cancel=%d\n", c, answeredNow, cancel)
}

proctype Caller(byte c) {
    bool ok = true;
    byte v, immediate, cancel, answeredNow;
    if
    :: c > 0 ->
        atomic {
            /* join() */
            if
            :: phase == RUNNING -> waitingCount++; slot[c] = PENDING; joined++
            :: else -> ok = false; assert(phase == COMPLETED || leftCount == joined)  /* over */
            fi;
            printf("TRACE join c=%d ok=%d\n", c, ok)
        }
    :: else -> skip
    fi;
    if
    :: !ok -> goto done    /* the call is over: it starts a call of its own (not modelled) */
    :: else -> skip
    fi;
    /* Cancelled on its way to suspend, or not. */
    if
    :: atomic { cancelsLeft > 0 -> cancelsLeft--; leave(c) }
    :: skip
    fi;
    atomic {
        /* install(_:_:) */
        if
        :: phase == COMPLETED ->
            slot[c] = LEFT; immediate = outcome           /* withdraw, and the outcome */
        :: phase != COMPLETED && slot[c] == HANDED ->
            slot[c] = LEFT; immediate = handed[c]         /* claim: what was handed to it */
        :: else ->
            slot[c] = WAITING; immediate = 0              /* park */
        fi;
        printf("TRACE install c=%d immediate=%d\n", c, immediate);
        if
        :: immediate != 0 -> deliver(c, immediate)
        :: else -> skip
        fi
    };
    if
    :: answer[c]?v
    :: atomic { cancelsLeft > 0 && slot[c] == WAITING -> cancelsLeft--; leave(c) }; answer[c]?v
    fi;
done:
    atomic { finished++ }
}

/* The first task's handle is reported: firstTaskStarted(_:). */
proctype Starter() {
    bool cancelNow;
    atomic {
        if
        :: phase == COMPLETED -> cancelNow = true
        :: else ->
            if
            :: handedOver -> cancelNow = true
            :: else -> task = 1; cancelNow = (phase == ABANDONED)
            fi
        fi;
        if
        :: cancelNow -> cancelledTask[1] = true
        :: else -> skip
        fi;
        printf("TRACE firstTask cancel=%d\n", cancelNow)
    }
}

/* The first task: attempts until one is answered, its timeout hands the rest over, or it is
   cancelled. */
proctype Runner() {
    byte a = 0;
    bool claimed;
    do
    :: a < ATTEMPTS ->
        atomic {
            /* open(attempt:permit:) */
            if
            :: phase != COMPLETED -> open = true; openAttempt = a
            :: else -> skip
            fi;
            printf("TRACE open a=%d\n", a)
        };
        run Watchdog(a);
        atomic {
            /* the answer (or the cancellation) arrives: claim(attempt:) */
            claimed = (phase != COMPLETED && open && openAttempt == a);
            if
            :: claimed -> open = false; assert(claimedBy[a] == 0); claimedBy[a] = 1
            :: else -> skip
            fi;
            printf("TRACE claim a=%d ok=%d\n", a, claimed)
        };
        if
        :: !claimed -> break          /* superseded by the timeout */
        :: claimed && cancelledTask[1] -> atomic { complete(CANCELLED) }; break
        :: claimed -> atomic { complete(SUCCESS) }; break   /* answered before a cancel took */
        :: claimed && !cancelledTask[1] && a + 1 < ATTEMPTS -> a++   /* a retryable failure */
        fi
    :: else -> break
    od
}

/* The watchdog of attempt `a`: its deadline passes, or the attempt ends first. */
proctype Watchdog(byte a) {
    bool expired, abandoned;
    byte superseded;
    if
    :: atomic {
        timeoutsLeft > 0 -> timeoutsLeft--;
        /* timeOut(attempt:) */
        expired = (phase != COMPLETED && open && openAttempt == a);
        if
        :: expired ->
            open = false;
            assert(claimedBy[a] == 0); claimedBy[a] = 2;
            superseded = task;
            if
            :: superseded != 0 -> cancelledTask[superseded] = true
            :: else -> skip
            fi;
            task = 0;
            handedOver = true;
            abandoned = (phase == ABANDONED)
        :: else -> skip
        fi;
        printf("TRACE timeout a=%d ok=%d superseded=%d abandoned=%d\n", a, expired, superseded, abandoned)
       };
       if
       :: expired -> run Successor(abandoned)
       :: else -> skip
       fi
    :: true -> skip
    fi
}

/* The task the timeout started: reported with taskStarted(_:), then it ends the request with the
   timed-out attempt's result (a cancelled call, when every caller had left). */
proctype Successor(bool abandoned) {
    bool cancelNow;
    atomic {
        if
        :: phase == COMPLETED -> cancelNow = true
        :: else -> task = 2; cancelNow = (phase == ABANDONED)
        fi;
        if
        :: cancelNow -> cancelledTask[2] = true
        :: else -> skip
        fi;
        printf("TRACE successor cancel=%d\n", cancelNow)
    };
    atomic {
        if
        :: abandoned || cancelledTask[2] -> complete(CANCELLED)
        :: else -> complete(TIMEDOUT)
        fi
    }
}

init {
    atomic {
        byte i = 0;
        slot[0] = PENDING;
        run Starter();
        run Runner();
        do
        :: i < NW -> run Caller(i); i++
        :: else -> break
        od
    }
}

ltl answered { <> (finished == NW) }
