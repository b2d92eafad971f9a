#!/usr/bin/env bash
# The searched prose recipe (experiment=europarl_tatoeba_cpu_2h) trained four ways at
# once, one thread each, for the same number of updates: as it is, with subword sampling,
# with augmentation and a vocabulary trained on cased copies too, and with the corpus
# filters. Then each model's checkpoint at update STEP is scored on FLORES-200 devtest,
# and on the first 500 lines of FLORES and europarl-test and 1,000 of tatoeba-test, clean
# and with the sources upper-cased, title-cased and without final punctuation
# (tatoeba-test also with typos). Tables: python scripts/studies/data_arms_table.py runs/arms
#   bash scripts/studies/data_arms.sh train                     # the four runs, at once
#   STEP=2500 bash scripts/studies/data_arms.sh evaluate        # every arm's step_2500
#   STEP=2500 ARM=base bash scripts/studies/data_arms.sh evaluate
#   STEP=1000 ARM=base bash scripts/studies/data_arms.sh tatoeba  # tatoeba-test alone (a curve)
set -euo pipefail
STEPS=${STEPS:-4000}
OUT=${OUT:-runs/arms}
declare -A ARMS=(
  [base]=""
  [subword]="data.subword_sampling.alpha=0.1 data.subword_sampling.nbest=-1"
  [augment_cased]="data.augment.upper=0.07 data.augment.title=0.05 data.augment.nopunct=0.2 data.augment.typos=0.05 data.spm_case_copies=0.1"
  [filters]="data.filters.char_ratio=3 data.filters.numbers=true data.filters.script=0.1 data.filters.langid=0.01 data.filters.dedup=pairs"
)
case "${1:-}" in
  train)
    mkdir -p "$OUT"
    for arm in "${!ARMS[@]}"; do
      # shellcheck disable=SC2086  # the overrides are words
      nohup mt-train experiment=europarl_tatoeba_cpu_2h trainer.max_hours=null trainer.max_steps="$STEPS" \
        trainer.num_threads=1 trainer.progress=false trainer.run_dir="$OUT/$arm" ${ARMS[$arm]} \
        > "$OUT/$arm.log" 2>&1 &
    done
    wait ;;
  evaluate|tatoeba)
    # the first lines of each set: 500 of FLORES and europarl-test (upper-cased prose is
    # three times as many pieces for a plain vocabulary, and a model that cannot read it
    # writes to the length bound), 1,000 of tatoeba-test; FLORES also whole, clean
    for set in flores200-devtest:fl:500 europarl-test:eu:500 tatoeba-test:ta:1000; do
      IFS=: read -r name short n <<< "$set"
      for side in it en; do head -"$n" "${DATA:-../shared/data}/eval/$name.$side" > "$OUT/$short$n.$side"; done
    done
    for arm in ${ARM:-"${!ARMS[@]}"}; do
      ckpt="$OUT/$arm/checkpoints/step_${STEP:-$STEPS}"
      sets=(fl500 eu500 ta1000); [[ $1 == tatoeba ]] && sets=(ta1000)
      [[ $1 == evaluate ]] && mt-evaluate checkpoint="$ckpt" test_set=flores200-devtest decode=beam threads="${THREADS:-2}"
      for set in "${sets[@]}"; do
        for p in none upper title nopunct $([[ $set == ta* ]] && echo typos); do
          extra=(); [[ $p != none ]] && extra=(perturb="$p")
          mt-evaluate checkpoint="$ckpt" test_set="$OUT/$set.it,$OUT/$set.en" decode=beam threads="${THREADS:-2}" "${extra[@]}"
        done
      done
    done ;;
  *) echo "usage: $0 train|evaluate|tatoeba" >&2; exit 2 ;;
esac
