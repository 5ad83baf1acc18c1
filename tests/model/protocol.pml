/* dispatch-slurm's protocol as a Promela model for SPIN.

   What is modelled: NE executions of one job, each a submission (its N allocated under
   sub/, O_EXCL), its env (the N checked, the epoch claimed under epochs/), its resume
   from `latest`, its trainer writing NS saves into its own exec folder and its `watch`
   publishing each complete save (fsync the save, then O_EXCL pub/<epoch>-<step>-<path>,
   then fsync pub/); the Epilog's cessation evidence; one gc run (keep-last 1: it removes
   everything of a ceased execution but the latest), with its retired/ markers, its
   second look at pinned/ and pub/, and its removal; one adoption (`publish --adopt`:
   another execution's save published at this execution's epoch, pinned while it
   publishes); one crash at any step, which loses every write not yet fsynced and stops
   every process running at that moment (processes not started yet run after it). No
   process is ever forced to move: the old execution may run on after its replacement
   started for as long as it likes, or stop anywhere.

   The epoch is N (G = 0, R = 0): an execution's epoch orders it among the others
   exactly as G*10^12 + N*10^6 + R does. Steps: execution k resumes at step r and saves
   r+1 .. r+NS. A save's path is (execution, step); a publication is (epoch, path).

   The broken designs the README says lose, each a compile-time variant the checker
   must reject with a counterexample:
     -DVARIANT_POINTER           a `latest` pointer written after check-then-rename
     -DVARIANT_SHARED_FOLDER     one shared folder, saves named by step, rotation by name
     -DVARIANT_GC_NO_CESSATION   gc removes what Slurm says ended (no cessation evidence)
     -DVARIANT_PUBLISH_BEFORE_FSYNC  the publication made before the save is fsynced
     -DVARIANT_ADOPT_CHECK_BEFORE_PIN  the adopter looks at retired/ before it pins
     -DVARIANT_SUBMIT_NO_EXCL    N taken as max+1 of sub/ without O_EXCL, and no epoch claims
     -DVARIANT_GC_NO_PUB_FSYNC   gc removes without fsyncing pub/ first (what gc did before
                                 this model found it: a crash could lose the latest gc kept
                                 while its removals stayed, bringing back an older latest
                                 whose save it had removed)

   Each step of the model carries a marker @step(NAME); tests/model/mapping.toml maps
   every NAME to the functions that implement it, and tests/test_model.py checks both
   ways (a step without a mapping, a mapped function renamed or removed). */

#ifndef NE
#define NE 3            /* executions */
#endif
#ifndef NS
#define NS 2            /* saves per execution */
#endif
#ifndef ADOPT
#define ADOPT 1         /* one adoption */
#endif
#ifndef NGC
#define NGC 1           /* gc runs */
#endif
#ifndef CRASH
#define CRASH 1         /* one crash */
#endif
#ifndef INLINE_PUBLISH
#define INLINE_PUBLISH 0  /* 1: the trainer publishes each save itself (the preemption handler,
                             the integrations), no watch: fewer processes, room for a third execution */
#endif

#define NSTEP (NE*NS+1)             /* steps 0 .. NE*NS */
#define NSLOT (NE*NSTEP)
#ifdef VARIANT_SHARED_FOLDER
#define SLOT(k, s) (s)              /* one folder: checkpoint-<step>, whoever wrote it */
#else
#define SLOT(k, s) ((k)*NSTEP + (s))  /* exec/<attempt k>/checkpoint-<step> */
#endif
#define STEP(x) ((x) % NSTEP)
#define BIT(e) (1 << (e))

/* a save's state */
#define ABSENT 0
#define DONE 2        /* written and complete (trainer_state.json parses), not fsynced */
#define DURABLE 3     /* complete and fsynced */
#define REMOVING 4    /* gc is removing it (partly removed) */

byte save[NSLOT];       /* each save's state */
byte sw[NSLOT];       /* who wrote it: execution + 1 */
byte pubs[NSLOT];     /* pub/: the epochs (a bit each) each save is published at */
byte pubd[NSLOT];     /* ... of which fsynced (durable) */
byte rmk[NSLOT];      /* retired/: gc's markers, as epochs (a bit each); fsynced when made */
bit pin[NSLOT];       /* pinned/ */
byte sub[NE + 2];     /* sub/<N>: 0 absent, 2 created and fsynced */
byte claim[NE + 2];   /* epochs/<N>: the claimant execution + 1 (O_EXCL, fsynced) */
bit ceased[NE];       /* ceased/<attempt>.<node>: the Epilog's evidence (or the node rebooted) */
#ifdef VARIANT_POINTER
byte ptr_e, ptr_x, ptrd_e, ptrd_x;  /* the pointer file (epoch, save), and what is fsynced of it */
#endif

/* ghost state: what really happened, for the invariants only */
byte ep[NE];          /* execution k's epoch, once its env passed (0: not running) */
bit gone[NE];         /* execution k's processes have all stopped */
bit trained[NE];      /* its trainer has exited */
int ready[NE];        /* the steps of its saves that are complete (trainer_state.json parses) */
byte tboot[NE];       /* the boot its trainer started in, + 1 (0: not started) */
byte ack_e, ack_s;    /* the greatest (epoch, step) whose publication returned (durable) */
byte boot;            /* crashes so far: a process started before a crash is dead */

/* scratch for the d_steps (always 0 between steps, so no state is made of them) */
byte ge, gx, gi, gj, le, lx;

#define GT(e1, s1, e2, s2) ((e1) > (e2) || ((e1) == (e2) && (s1) > (s2)))
#define GE(e1, s1, e2, s2) ((e1) > (e2) || ((e1) == (e2) && (s1) >= (s2)))

#define BROKEN(text) printf(text); assert(false)

/* latest -> (le, lx): the epoch and save `latest` names, le == 0 when nothing is published.
   @step(latest) */
inline latest() {
#if defined(VARIANT_POINTER)
  le = ptr_e; lx = ptr_x;
#elif defined(VARIANT_SHARED_FOLDER)
  /* the greatest checkpoint-<step> of the shared folder that is complete and fsynced */
  le = 0; lx = 0; gx = NSTEP - 1;
  do
  :: gx == 0 -> break
  :: gx > 0 && save[gx] == DURABLE -> le = ep[sw[gx] - 1]; lx = gx; break
  :: gx > 0 && save[gx] != DURABLE -> gx--
  od;
  gx = 0;
#else
  /* the publication with the greatest (epoch, step), ties broken by name */
  le = 0; lx = 0; ge = NE;
  do
  :: ge == 0 || le != 0 -> break
  :: else ->
     gx = 0;
     do
     :: gx == NSLOT -> break
     :: else ->
        if
        :: (pubs[gx] & BIT(ge)) && (le == 0 || STEP(gx) >= STEP(lx)) -> le = ge; lx = gx
        :: else
        fi;
        gx++
     od;
     ge--
  od;
  ge = 0; gx = 0;
#endif
}

/* The guarantees that hold in every state, checked after every step that changes one of
   them (inside that step, so nothing runs in between). */
inline check() {
  latest();
  if
  :: !GE(le, STEP(lx), ack_e, ack_s) ->
     BROKEN("INVARIANT BROKEN: an old execution's publication never outranks the replacement's\n")
  :: else
  fi;
  if
  :: le != 0 && !(save[lx] == DONE || save[lx] == DURABLE) ->
     BROKEN("INVARIANT BROKEN: latest names a complete, durable save\n")
  :: else
  fi;
#if !defined(VARIANT_POINTER) && !defined(VARIANT_SHARED_FOLDER)
  if
  :: le != 0 && (rmk[lx] & BIT(le)) ->
     BROKEN("INVARIANT BROKEN: the latest is never removed (it is retired)\n")
  :: else
  fi;
#endif
  le = 0; lx = 0
}

/* a save is removed (by gc, or a rotation by name: `by`, the execution removing, GC for
   gc): never one of another execution that has not ceased, never the latest */
#define GC 255
inline removing(x, by) {
  if
  :: sw[x] != 0 && sw[x] != by + 1 && !gone[sw[x] - 1] ->
     BROKEN("INVARIANT BROKEN: no save of an execution that has not ceased is removed\n")
  :: else
  fi;
  latest();
  if
  :: le != 0 && lx == x -> BROKEN("INVARIANT BROKEN: the latest is never removed\n")
  :: else
  fi;
  le = 0; lx = 0
}

inline acked(e, x) {
  if
  :: GT(e, STEP(x), ack_e, ack_s) -> ack_e = e; ack_s = STEP(x)
  :: else
  fi
}

/* publish(save x) at epoch e for execution k: returns once everything is durable.
   store/publish.py::publish */
inline publish(k, e, x) {
#if defined(VARIANT_SHARED_FOLDER)
  /* no publication: a save is visible once complete (and here, fsynced) */
  d_step {   /* @step(publish_sync) */
    if
    :: save[x] == DONE && sw[x] == k + 1 -> save[x] = DURABLE; acked(e, x);
       printf("MODEL: E%d trainer: checkpoint-%d fsynced: visible (epoch %d)\n", k, STEP(x), e); check()
    :: else
    fi
  }
#elif defined(VARIANT_POINTER)
  /* fsync the save, check the pointer, then rename a new pointer over it */
  d_step {   /* @step(publish_sync) */
    save[x] == DONE -> save[x] = DURABLE; printf("MODEL: E%d publish: save checkpoint-%d fsynced\n", k, STEP(x))
  };
  if
  :: atomic { GT(e, STEP(x), ptr_e, STEP(ptr_x)) ->     /* @step(pointer_check) */
       printf("MODEL: E%d publish: the pointer names epoch %d step %d, older: replace it\n", k, ptr_e, STEP(ptr_x)) };
     /* ... a stall here: another execution may move the pointer meanwhile */
     d_step { ptr_e = e; ptr_x = x;   /* @step(pointer_rename) */
              printf("MODEL: E%d publish: latest -> epoch %d step %d (rename)\n", k, e, STEP(x)); check() };
     d_step { ptrd_e = ptr_e; ptrd_x = ptr_x; acked(e, x); check() }  /* @step(pointer_fsync) */
  :: else -> d_step { acked(e, x); check() }    /* the pointer is newer: nothing to do */
  fi
#else
#ifndef VARIANT_PUBLISH_BEFORE_FSYNC
  d_step {   /* @step(publish_claim) the epoch is this execution's; @step(publish_sync) */
    assert(claim[e] == k + 1);
    if :: save[x] == DONE -> save[x] = DURABLE :: else fi;
    printf("MODEL: E%d publish: save checkpoint-%d fsynced\n", k, STEP(x))
  };
#endif
  d_step { pubs[x] = pubs[x] | BIT(e);             /* @step(publish_create) */
           printf("MODEL: E%d publish: pub/ epoch %d step %d created (save of E%d)\n", k, e, STEP(x), x / NSTEP);
           check() };
  d_step { pubd[x] = pubd[x] | BIT(e);              /* @step(publish_fsync): then publish returns */
           printf("MODEL: E%d publish: pub/ fsynced: epoch %d step %d published\n", k, e, STEP(x));
#ifndef VARIANT_PUBLISH_BEFORE_FSYNC
           acked(e, x);
#endif
           check() };
#ifdef VARIANT_PUBLISH_BEFORE_FSYNC
  d_step {   /* @step(publish_sync): the save fsynced last; then publish returns */
    if :: save[x] == DONE -> save[x] = DURABLE :: else fi;
    printf("MODEL: E%d publish: save checkpoint-%d fsynced\n", k, STEP(x));
    acked(e, x); check()
  }
#endif
#endif
}

/* One execution of the job: its submission, env, resume, and the trainer's saves. */
proctype trainer(byte k) {
  byte n, s, j, x, r;
  tboot[k] = boot + 1;   /* the job starts (at any time, or never) */
  {
    /* submit: the next N, max+1 of sub/, O_EXCL; on EEXIST the next one */
    d_step {   /* @step(submit_list) */
      n = 0; gi = 1;
      do :: gi <= NE + 1 -> if :: sub[gi] != 0 -> n = gi :: else fi; gi++ :: else -> break od;
      gi = 0; n++;
      printf("MODEL: E%d submit: lists sub/, takes N=%d\n", k, n)
    };
#ifdef VARIANT_SUBMIT_NO_EXCL
    atomic { sub[n] = 2; printf("MODEL: E%d submit: sub/%d written (no O_EXCL)\n", k, n) };   /* @step(submit_create) */
#else
    do   /* @step(submit_create): O_EXCL sub/<N>, fsynced with sub/ before N is used */
    :: atomic { sub[n] == 0 -> sub[n] = 2; printf("MODEL: E%d submit: sub/%d created\n", k, n); break }
    :: atomic { sub[n] != 0 -> n++; assert(n <= NE + 1) }
    od;
#endif
    /* env: N must be allocated; claim epochs/<N> (O_EXCL), or find it another's: refused */
    atomic {   /* @step(env_claim) */
      if
#ifdef VARIANT_SUBMIT_NO_EXCL
      :: sub[n] != 0 ->   /* and no claim under epochs/ */
#else
      :: sub[n] != 0 && (claim[n] == 0 || claim[n] == k + 1) ->
#endif
         claim[n] = k + 1; ep[k] = n; printf("MODEL: E%d env: epochs/%d claimed\n", k, n);
         gi = 0;
         do
         :: gi == NE -> break
         :: else ->
            if
            :: gi != k && ep[gi] == n -> BROKEN("INVARIANT BROKEN: two executions never share an epoch\n")
            :: else
            fi;
            gi++
         od;
         gi = 0
      :: else -> printf("MODEL: E%d env: refused (N=%d)\n", k, n); goto refused
      fi
    };
    /* resume: latest --resume; a vanished save is an error (the job stops) */
    d_step {   /* @step(resume) */
      latest();
      if
      :: le != 0 && !GE(le, STEP(lx), ack_e, ack_s) ->
         BROKEN("INVARIANT BROKEN: a resumed execution starts from the greatest published step of the greatest epoch\n")
      :: le != 0 && !(save[lx] == DONE || save[lx] == DURABLE) ->
         BROKEN("INVARIANT BROKEN: latest names a complete, durable save\n")
      :: else
      fi;
      printf("MODEL: E%d latest --resume: epoch %d, step %d\n", k, le, STEP(lx));
      s = STEP(lx); j = 0;
      le = 0; lx = 0
    };
    do
    :: j == NS -> break
    :: else ->
       d_step {   /* @step(trainer_save): checkpoint-<step>/, trainer_state.json written last */
         j++; s++; x = SLOT(k, s);
#ifdef VARIANT_SHARED_FOLDER
         if  /* the same name in the shared folder: written over */
         :: save[x] != ABSENT && sw[x] != k + 1 ->
            printf("MODEL: E%d trainer: writes over checkpoint-%d of E%d\n", k, s, sw[x] - 1); removing(x, k)
         :: else
         fi;
#endif
         save[x] = DONE; sw[x] = k + 1; ready[k] = ready[k] | BIT(s);
         printf("MODEL: E%d trainer: checkpoint-%d written (not fsynced)\n", k, s);
#ifndef VARIANT_SHARED_FOLDER
         if :: j == NS -> trained[k] = 1 :: else fi;   /* the trainer exits after its last save */
#endif
         check()
       };
#if INLINE_PUBLISH && !defined(VARIANT_SHARED_FOLDER)
       publish(k, ep[k], x);
#endif
#ifdef VARIANT_SHARED_FOLDER
       publish(k, ep[k], x);   /* the trainer fsyncs it; `latest` is the greatest complete step */
       d_step {   /* @step(rotate_by_name): keep the newest (save_total_limit=1) */
         r = 1;
         do
         :: r == s -> break
         :: else ->
            if
            :: save[r] != ABSENT ->
               printf("MODEL: E%d rotation: removes checkpoint-%d (written by E%d)\n", k, r, sw[r] - 1);
               removing(r, k); save[r] = ABSENT; sw[r] = 0
            :: else
            fi;
            r++
         od;
         r = 0; check()
       };
#endif
       x = 0
    od;
#ifdef VARIANT_SHARED_FOLDER
    trained[k] = 1;
#endif
#if INLINE_PUBLISH
    atomic { gone[k] = 1; ceased[k] = 1; printf("MODEL: E%d has ceased (the Epilog's ceased/ entry)\n", k) };
#endif
  } unless { boot + 1 != tboot[k] };
refused:
  skip
}

/* watch --until-pid: publishes each complete save of the execution in step order, a
   final scan once the trainer exited; then the Epilog records that it ceased. */
proctype watch(byte k) {
  byte mine, s, x;
  int done;   /* the steps this watch published */
end_wait:
  atomic { ep[k] != 0 && tboot[k] == boot + 1 -> mine = boot };
  {
    do
    :: atomic {   /* @step(watch_scan): the first complete save not published yet, in step order */
         (ready[k] & ~done) != 0 ->
         s = 1;
         do :: ready[k] & ~done & BIT(s) -> break :: else -> s++ od;
         done = done | BIT(s); x = SLOT(k, s); s = 0
       };
#ifndef VARIANT_SHARED_FOLDER
       publish(k, ep[k], x);
#endif
       x = 0
    :: atomic { trained[k] && (ready[k] & ~done) == 0 -> break }   /* the final scan found nothing */
    od;
    atomic { gone[k] = 1; ceased[k] = 1; printf("MODEL: E%d has ceased (the Epilog's ceased/ entry)\n", k) }   /* @step(epilog_ceased) */
  } unless { boot != mine }
}

/* gc --keep-last 1: everything of a ceased execution goes but the latest. */
proctype gc() {
  byte mine, cz, x;
  bit doom[NSLOT];    /* the saves it removes */
  byte snap[NSLOT];   /* the publications it saw of each of them */
  mine = boot;
  {
    d_step {   /* @step(gc_cessation): which executions have ceased, asked first */
#ifdef VARIANT_GC_NO_CESSATION
      /* Slurm says an execution ended once a later one runs: no evidence asked */
      gi = 0;
      do
      :: gi == NE -> break
      :: else -> gj = 0;
         do
         :: gj == NE -> break
         :: else -> if :: ep[gi] != 0 && ep[gj] > ep[gi] -> cz = cz | BIT(gi) :: else fi; gj++
         od;
         gi++
      od;
      gi = 0; gj = 0
#else
      gi = 0;
      do :: gi == NE -> break :: else -> if :: ceased[gi] -> cz = cz | BIT(gi) :: else fi; gi++ od;
      gi = 0;
#endif
      /* @step(gc_scan): the inventory and the verdicts */
      latest();
      x = 0;
      do
      :: x == NSLOT -> break
      :: else ->
         if
         :: sw[x] != 0 && (save[x] != ABSENT || pubs[x] != 0) && (cz & BIT(sw[x] - 1)) && !pin[x] &&
            !(le != 0 && lx == x) -> doom[x] = 1; snap[x] = pubs[x];
            printf("MODEL: gc scan: latest epoch %d step %d; removes E%d's checkpoint-%d\n", le, STEP(lx), x / NSTEP, STEP(x))
         :: else
         fi;
         x++
      od;
      x = 0; le = 0; lx = 0; cz = 0
    };
    d_step {   /* @step(gc_retire): pub/ fsynced, then retired/<name> for each publication
                  (a leftover: the name it would have had) */
      x = 0;
      do
      :: x == NSLOT -> break
      :: else ->
#ifndef VARIANT_GC_NO_PUB_FSYNC
         pubd[x] = pubs[x];   /* @step(gc_sync_pub): what the inventory saw is durable */
#endif
         if
         :: doom[x] -> rmk[x] = rmk[x] | (snap[x] != 0 -> snap[x] : BIT(ep[sw[x] - 1]));
            printf("MODEL: gc: retired/ marker of E%d's checkpoint-%d (fsynced)\n", x / NSTEP, STEP(x))
         :: else
         fi;
         x++
      od;
      x = 0; check()
    };
    d_step {   /* @step(gc_recheck): pinned, or published again, meanwhile: kept */
      x = 0;
      do
      :: x == NSLOT -> break
      :: else ->
         if
         :: doom[x] && (pin[x] || (pubs[x] & ~snap[x])) -> doom[x] = 0;
            printf("MODEL: gc: E%d's checkpoint-%d pinned or published again: kept\n", x / NSTEP, STEP(x))
         :: else
         fi;
         snap[x] = 0;
         x++
      od;
      x = 0
    };
    do
    :: d_step {   /* @step(gc_remove): the next save, its folders through fds, never a symlink */
         x = 0;
         do :: x == NSLOT || doom[x] -> break :: else -> x++ od;
         if
         :: x < NSLOT -> removing(x, GC); save[x] = REMOVING; doom[x] = 0;
            printf("MODEL: gc: removing E%d's checkpoint-%d\n", x / NSTEP, STEP(x)); check()
         :: else
         fi
       };
       if
       :: x == NSLOT -> break
       :: else -> d_step { save[x] = ABSENT; x = 0; check() }   /* its last file gone */
       fi
    od
  } unless { boot != mine }
}

/* publish --adopt SAVE inside execution j: another execution's save at j's epoch. */
proctype adopt() {
  byte mine, i, j, s, x, e;
  bit mypin;
  mine = boot;
  {
    atomic {   /* @step(adopt_choose): inside execution j, a person names a save of execution i */
      if
      :: j = 0 :: j = 1
#if NE > 2
      :: j = 2
#endif
      fi;
      ep[j] != 0 -> e = ep[j];
      if
      :: j != 0 -> i = 0 :: j != 1 -> i = 1
#if NE > 2
      :: j != 2 -> i = 2
#endif
      fi;
      s = 1;
      do :: s < NSTEP - 1 -> s++ :: break od;
      x = SLOT(i, s); s = 0; i = 0;
      if :: save[x] != DONE && save[x] != DURABLE -> goto out :: else fi;   /* "does not exist" */
      printf("MODEL: adopt: E%d adopts E%d's checkpoint-%d at epoch %d\n", j, x / NSTEP, STEP(x), e)
    };
    atomic {   /* @step(publish_claim) the epoch is j's; @step(publish_sync) */
      assert(claim[e] == j + 1);
      if
      :: save[x] == DONE -> save[x] = DURABLE
      :: save[x] == DURABLE
      :: else -> goto out   /* removed meanwhile: "does not exist" */
      fi
    };
#ifdef VARIANT_ADOPT_CHECK_BEFORE_PIN
    if :: rmk[x] != 0 -> goto out :: else -> printf("MODEL: adopt: not retired\n") fi;   /* @step(adopt_check_retired) */
    atomic { if :: !pin[x] -> pin[x] = 1; mypin = 1 :: else fi; printf("MODEL: adopt: pinned\n") };   /* @step(adopt_pin) */
#else
    atomic { if :: !pin[x] -> pin[x] = 1; mypin = 1 :: else fi; printf("MODEL: adopt: pinned\n") };   /* @step(adopt_pin) */
    if :: rmk[x] != 0 -> printf("MODEL: adopt: refused, retired by gc\n"); goto unpin :: else fi;   /* @step(adopt_check_retired) */
#endif
    d_step { pubs[x] = pubs[x] | BIT(e); printf("MODEL: adopt: pub/ epoch %d step %d created\n", e, STEP(x)); check() };   /* @step(publish_create) */
    d_step { pubd[x] = pubd[x] | BIT(e); acked(e, x); printf("MODEL: adopt: published\n"); check() };   /* @step(publish_fsync) */
unpin:
    if :: mypin -> pin[x] = 0 :: else fi;   /* @step(adopt_unpin) */
out:
    skip
  } unless { boot != mine }
}

/* A crash: every write not yet fsynced is lost; every process started before it stops
   (an execution it stopped has ceased: its nodes rebooted). */
active proctype crash() {
  byte x;
#if CRASH
  d_step {   /* @step(crash) */
    x = 0;
    do
    :: x == NSLOT -> break
    :: else ->
       if :: save[x] == DONE -> save[x] = ABSENT; sw[x] = 0 :: else fi;
       pubs[x] = pubd[x];
       x++
    od;
    x = 0;
    gi = 1;
    do :: gi == NE + 2 -> break :: else -> if :: sub[gi] == 1 -> sub[gi] = 0 :: else fi; gi++ od;
    gi = 0;
    do
    :: gi == NE -> break
    :: else -> if :: tboot[gi] == boot + 1 && !gone[gi] -> gone[gi] = 1; ceased[gi] = 1 :: else fi; gi++
    od;
    gi = 0;
#ifdef VARIANT_POINTER
    ptr_e = ptrd_e; ptr_x = ptrd_x;
#endif
    boot++;
    printf("MODEL: CRASH: every write not fsynced is lost; every running process stops\n");
    check()
  }
#endif
}

init {
  byte k;
  atomic {
    do
    :: k == NE -> break
    :: else ->
       run trainer(k);
#if !INLINE_PUBLISH
       run watch(k);
#endif
       k++
    od;
#if NGC
    run gc();
#endif
#if ADOPT
    run adopt();
#endif
    k = 0
  }
}
